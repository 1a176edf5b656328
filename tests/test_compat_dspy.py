"""DSPy users' programs, unchanged, under `OptoOptimizer`: each program kind of DSPy's
tutorials is compiled by `dspy.GEPA` and by `OptoOptimizer` with the same keywords, the
same scripted models (behind `FakeOpenAIServer`), data and metric-call budget; opto's
held-out score must be no lower, at no more metric calls, and the compiled program must
`save`/`load`. Then DSPy's teleprompter contract, as its own tests state it.

The program's model follows DSPy's chat format and answers right only when a predictor's
instructions hold the sentence `MAGIC` asks for; the reflection model, asked by GEPA (its
``` prompt) or by opto (its JSON prompt), appends `MAGIC` to the instructions it is shown.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import pydantic
import pytest

from opto import OptoValueError
from opto.testing import FakeOpenAIServer

dspy = pytest.importorskip("dspy", reason="the dspy extra: pip install 'opto-agents[dspy]'")
pytest.importorskip("gepa", reason="dspy.GEPA needs the gepa extra")
from opto.integrations.dspy import OptoOptimizer  # noqa: E402

CAPITALS = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Peru": "Lima", "Japan": "Tokyo",
            "Kenya": "Nairobi", "Egypt": "Cairo", "Chile": "Santiago", "Ghana": "Accra", "Nepal": "Kathmandu",
            "Cuba": "Havana", "Fiji": "Suva", "Laos": "Vientiane", "Mali": "Bamako", "Oman": "Muscat",
            "Togo": "Lome", "Iran": "Tehran", "Iraq": "Baghdad"}  # fmt: skip
COUNTRIES = list(CAPITALS)
MAGIC = "Use the lookup tool, search with the country name, answer with the capital city; urgent means high."
BUDGET = 120


def country_in(text: str) -> str | None:
    return next((c for c in COUNTRIES if re.search(rf"\b{c}\b", text)), None)


# The scripted models ---------------------------------------------------------------------


def chat_reply(body: dict[str, Any]) -> str:
    """The program's model in DSPy's chat format, or a reflection model (GEPA's or opto's)."""
    texts = [m["content"] for m in body["messages"] if isinstance(m.get("content"), str)]
    whole = "\n".join(texts)
    if "within ``` blocks" in whole:  # GEPA's reflection: the current instruction, with MAGIC
        current = whole.split("```", 2)[1].strip()
        return f"```\n{current if MAGIC in current else (current + ' ' + MAGIC).strip()}\n```"
    if "improve the parameters" in whole:  # opto's reflection
        found = re.findall(r"## (\S+)\n- type: [^\n]*\n- trainable: yes\n(?:- description: [^\n]*\n)?"
                           r"- current value: (\".*?\")\n", whole, re.S)  # fmt: skip
        update = {name: (json.loads(value) + " " + MAGIC).strip() for name, value in found if MAGIC not in value}
        return json.dumps({"reasoning": "follow the feedback", "suggestion": update})
    system, last = texts[0], texts[-1]
    fields = re.findall(r"\d+\. `(\w+)` \(", system.split("Your output fields are:")[1].split("All interactions")[0])
    values = answer_fields(fields, system.split("your objective is:")[-1], last)
    if "Outputs will be a JSON object" in system:  # DSPy's JSONAdapter (dspy.GEPA's reflection uses it)
        return json.dumps({f: json.loads(v) if f in ("ticket", "next_tool_args") else v for f, v in values.items()})
    return "\n\n".join(f"[[ ## {f} ## ]]\n{values[f]}" for f in fields) + "\n\n[[ ## completed ## ]]"


def answer_fields(fields: list[str], instructions: str, user: str) -> dict[str, Any]:
    """What each program's predictors say: right only under instructions holding MAGIC."""
    if "new_instruction" in fields:  # dspy.GEPA's reflection, a DSPy signature of its own
        found = re.search(r"\[\[ ## current_instruction ## \]\]\n(.*?)\n\n\[\[ ##", user, re.S)
        current = found.group(1).strip() if found else ""
        return {"new_instruction": current if MAGIC in current else f"{current} {MAGIC}".strip()}
    knows = MAGIC in instructions
    country = country_in(user.split("[[ ## trajectory ## ]]")[0]) or country_in(user)
    if "next_tool_name" in fields:  # ReAct's step
        if knows and "observation_0" not in user:
            return {"next_thought": "look it up", "next_tool_name": "lookup_capital",
                    "next_tool_args": json.dumps({"country": country})}  # fmt: skip
        return {"next_thought": "done", "next_tool_name": "finish", "next_tool_args": "{}"}
    if "query" in fields:
        return {"query": country if knows else "capitals"}
    if "ticket" in fields:
        ticket_id = re.search(r"#(\d+)", user).group(1)  # type: ignore[union-attr]
        priority = "high" if knows and "urgent" in user else "low"
        return {"ticket": json.dumps({"ticket_id": ticket_id, "priority": priority})}
    known = re.search(r"The capital of \w+ is (\w+)", user)
    # Multi-hop and ReAct answer from what was found, else (told how) from what they know.
    answer = (known.group(1) if known else CAPITALS.get(country or "", "unknown")) if knows else "I am not sure."
    return {"reasoning": "thinking", "answer": answer}


# The programs, as DSPy's tutorials write them ----------------------------------------------


def search(query: str) -> str:
    country = country_in(query)
    return f"The capital of {country} is {CAPITALS[country]}." if country else "No results."


def lookup_capital(country: str) -> str:
    """Look up the capital of a country."""
    return search(country)


class MultiHop(dspy.Module):
    def __init__(self) -> None:
        super().__init__()
        self.generate_query = dspy.Predict("question -> query")
        self.answer = dspy.ChainOfThought("question, context -> answer")

    def forward(self, question: str) -> Any:
        query = self.generate_query(question=question).query
        return self.answer(question=question, context=search(query))


class Ticket(pydantic.BaseModel):
    ticket_id: str
    priority: Literal["low", "high"]


class Triage(dspy.Signature):
    """File a ticket for the message."""

    message: str = dspy.InputField()
    ticket: Ticket = dspy.OutputField()


class ChatQA(dspy.Signature):
    """Answer the question."""

    question: str = dspy.InputField()
    history: dspy.History = dspy.InputField()
    answer: str = dspy.OutputField()


class WithHistory(dspy.Module):
    def __init__(self) -> None:
        super().__init__()
        self.respond = dspy.ChainOfThought(ChatQA)

    def forward(self, question: str, history: Any) -> Any:
        assert isinstance(history, dspy.History), type(history)  # the program's own type, not a dict
        return self.respond(question=question, history=history)


def qa_rows(countries: list[str]) -> list[Any]:
    return [dspy.Example(question=f"What is the capital of {c}?", answer=CAPITALS[c]).with_inputs("question")
            for c in countries]  # fmt: skip


def ticket_rows(countries: list[str]) -> list[Any]:
    rows = []
    for i, c in enumerate(countries):
        urgent = i % 2 == 0
        message = f"Ticket #{100 + i}: the office in {c} is {'urgently ' if urgent else ''}out of paper."
        rows.append(dspy.Example(message=message, ticket_id=str(100 + i), priority="high" if urgent else "low")
                    .with_inputs("message"))  # fmt: skip
    return rows


def history_rows(countries: list[str]) -> list[Any]:
    history = dspy.History(messages=[{"question": "Hello?", "answer": "Hello."}])
    return [dspy.Example(question=f"What is the capital of {c}?", history=history, answer=CAPITALS[c])
            .with_inputs("question", "history") for c in countries]  # fmt: skip


def qa_metric(gold: Any, pred: Any, trace: Any = None, pred_name: Any = None, pred_trace: Any = None) -> Any:
    right = str(pred.answer).strip() == gold.answer
    return dspy.Prediction(score=float(right), feedback="correct" if right else f"incorrect: expected {gold.answer}")


def ticket_metric(gold: Any, pred: Any, trace: Any = None, pred_name: Any = None, pred_trace: Any = None) -> Any:
    right = pred.ticket.ticket_id == gold.ticket_id and pred.ticket.priority == gold.priority  # typed access
    return dspy.Prediction(score=float(right), feedback="correct" if right else f"expected {gold.priority}")


CLIENTS = {
    "chain_of_thought": (lambda: dspy.ChainOfThought("question -> answer"), qa_rows, qa_metric),
    "multi_hop": (MultiHop, qa_rows, qa_metric),
    "react_with_a_tool": (lambda: dspy.ReAct("question -> answer", tools=[lookup_capital], max_iters=3), qa_rows,
                          qa_metric),  # fmt: skip
    "typed_pydantic_and_literal": (lambda: dspy.Predict(Triage), ticket_rows, ticket_metric),
    "history_input": (WithHistory, history_rows, qa_metric),
}


def score(program: Any, rows: list[Any], metric: Any) -> float:
    return sum(metric(row, program(**row.inputs())).score for row in rows) / len(rows)


@pytest.fixture
def lms() -> Any:
    with FakeOpenAIServer(chat_reply) as server:
        program_lm = dspy.LM("openai/program", api_base=server.base_url, api_key="test-key", cache=False)
        reflection_lm = dspy.LM("openai/reflection", api_base=server.base_url, api_key="test-key", cache=False,
                                max_tokens=4000)  # fmt: skip
        with dspy.context(lm=program_lm):
            yield program_lm, reflection_lm, server


@pytest.mark.parametrize("client", list(CLIENTS))
def test_a_tutorial_program_compiles_under_opto_as_well_as_under_dspy_gepa(client: str, lms: Any, tmp_path: Path):
    make, rows, metric = CLIENTS[client]
    _, reflection_lm, server = lms
    train, val, test = rows(COUNTRIES[:6]), rows(COUNTRIES[6:12]), rows(COUNTRIES[12:])
    keywords = dict(metric=metric, max_metric_calls=BUDGET, reflection_lm=reflection_lm, num_threads=4,
                    track_stats=True)  # fmt: skip
    native = dspy.GEPA(**keywords).compile(make(), trainset=train, valset=val)
    student = make()
    ours = OptoOptimizer(**keywords).compile(student, trainset=train, valset=val)

    assert score(ours, test, metric) >= score(native, test, metric)
    assert score(ours, test, metric) == 1.0 and score(student, test, metric) < 1.0  # the student is untouched
    native_calls = native.detailed_results.total_metric_calls
    assert ours.detailed_results.metric_calls <= max(native_calls, BUDGET)
    program_calls = ours.detailed_results.usage_by_model["openai/program"].calls
    assert program_calls >= ours.detailed_results.metric_calls  # every program call is in usage

    ours.save(str(tmp_path / "program.json"))
    loaded = make()
    loaded.load(str(tmp_path / "program.json"))
    assert score(loaded, test, metric) == 1.0


def test_gepa_s_own_dspy_adapter_runs_under_gepa_and_under_opto_s_bridge(lms: Any) -> None:
    """GEPA's DspyAdapter (its propose_new_texts asks the reflection LM with GEPA's prompt).
    gepa 0.1.4's adapter cannot evaluate without traces under dspy 3.4.1 (it passes
    `Evaluate(return_outputs=...)`, which DSPy removed), so `gepa.optimize` stops at its
    first validation; the bridge asks for traces, as a reflection needs them, and runs."""
    from gepa import optimize as gepa_optimize
    from gepa.adapters.dspy_adapter.dspy_adapter import DspyAdapter

    from opto.integrations.gepa import optimize

    _, reflection_lm, _ = lms

    def feedback(predictor_output: Any, predictor_inputs: Any, module_inputs: Any, module_outputs: Any,
                 captured_trace: Any) -> dict[str, Any]:  # fmt: skip
        found = qa_metric(module_inputs, module_outputs)
        return {"score": found.score, "feedback": found.feedback}

    def adapter() -> Any:
        return DspyAdapter(dspy.ChainOfThought("question -> answer"), metric_fn=qa_metric,
                           feedback_map={"predict": feedback}, reflection_lm=reflection_lm)  # fmt: skip

    train, val, test = qa_rows(COUNTRIES[:6]), qa_rows(COUNTRIES[6:12]), qa_rows(COUNTRIES[12:])
    seed = {"predict": dspy.ChainOfThought("question -> answer").predict.signature.instructions}
    with pytest.raises(ValueError, match="return_outputs"):
        gepa_optimize(seed, train, val, adapter(), max_metric_calls=60, display_progress_bar=False)
    ours = optimize(seed, train, val, adapter(), max_metric_calls=60)
    held_out = lambda candidate: sum(adapter().evaluate(test, candidate, True).scores) / len(test)  # noqa: E731
    assert ours.proposer == "adapter" and held_out(ours.best_candidate) == 1.0 and held_out(seed) == 0.0
    assert ours.total_metric_calls <= 60


def test_the_budget_stops_compile_at_the_metric_calls(lms: Any) -> None:
    _, reflection_lm, _ = lms
    for budget in (30, 80):
        optimizer = OptoOptimizer(qa_metric, max_metric_calls=budget, reflection_lm=reflection_lm)
        optimizer.compile(MultiHop(), trainset=qa_rows(COUNTRIES[:6]), valset=qa_rows(COUNTRIES[6:12]))
        assert optimizer.result is not None and optimizer.result.metric_calls <= budget


def test_auto_sizes_the_budget_as_dspy_gepa_does(lms: Any) -> None:
    _, reflection_lm, _ = lms
    optimizer = OptoOptimizer(qa_metric, auto="light", reflection_lm=reflection_lm)
    optimizer.compile(dspy.ChainOfThought("question -> answer"), trainset=qa_rows(COUNTRIES[:6]),
                      valset=qa_rows(COUNTRIES[6:12]))  # fmt: skip
    expected = dspy.GEPA.auto_budget(None, num_preds=1, num_candidates=6, valset_size=6)
    assert optimizer.result is not None and "MaxMetricCalls" in (optimizer.result.stopped_reason or "MaxMetricCalls")
    assert optimizer.result.metric_calls <= expected


def test_a_program_whose_replies_never_parse_is_scored_not_aborted(lms: Any) -> None:
    _, reflection_lm, _ = lms
    with FakeOpenAIServer("not DSPy's format at all") as broken:
        lm = dspy.LM("openai/broken", api_base=broken.base_url, api_key="k", cache=False, num_retries=0)
        with dspy.context(lm=lm, adapter=dspy.ChatAdapter(use_json_adapter_fallback=False)):
            optimizer = OptoOptimizer(qa_metric, max_metric_calls=40, reflection_lm=reflection_lm)
            compiled = optimizer.compile(dspy.Predict("question -> answer"), trainset=qa_rows(COUNTRIES[:4]))
    result = optimizer.result
    assert result is not None and "too many failures" not in (result.stopped_reason or "")
    assert compiled is not None and result.steps >= 1 and sum(result.train_failed) == 0  # scored, not crashed


def test_dummy_lm_as_dspy_s_tests_use_it() -> None:
    from dspy.utils.dummies import DummyLM

    program_lm = DummyLM([{"answer": "Lima"}] * 200)
    optimizer_lm = DummyLM([{"response": json.dumps({"reasoning": "r", "suggestion": {"program": "Name the capital."}})}]
                           * 50)  # fmt: skip
    with dspy.context(lm=program_lm):
        compiled = OptoOptimizer(qa_metric, model=optimizer_lm, max_metric_calls=30).compile(
            dspy.Predict("question -> answer"), trainset=qa_rows(["Peru", "Chile", "Cuba"])
        )
    assert isinstance(compiled, dspy.Predict) and compiled._compiled


def test_the_lm_s_own_settings_reach_the_optimizer_call() -> None:
    seen: list[dict[str, Any]] = []

    def reply(body: dict[str, Any]) -> str:
        seen.append(body)
        return chat_reply(body)

    with FakeOpenAIServer(reply) as server:
        program_lm = dspy.LM("openai/program", api_base=server.base_url, api_key="k", cache=False)
        reflection_lm = dspy.LM("openai/reflection", api_base=server.base_url, api_key="k", cache=False,
                                temperature=0.7, top_p=0.5, max_tokens=20000,
                                extra_headers={"X-Proxy-Auth": "token-1"})  # fmt: skip
        with dspy.context(lm=program_lm):
            OptoOptimizer(qa_metric, reflection_lm=reflection_lm, max_metric_calls=30).compile(
                dspy.Predict("question -> answer"), trainset=qa_rows(COUNTRIES[:6])
            )
        reflection = [r for r in server.requests if r.json and r.json.get("model") == "reflection"]
    asked = [b for b in seen if b.get("model") == "reflection"]
    assert asked and all(b["temperature"] == 0.7 and b["top_p"] == 0.5 and b["max_tokens"] == 20000 for b in asked)
    assert reflection and all(r.headers.get("x-proxy-auth") == "token-1" for r in reflection)


def test_the_teleprompter_contract_as_dspy_s_tests_state_it(lms: Any) -> None:
    """dspy's tests/teleprompt: compile returns a new program of the student's class, marked
    compiled; the student is unchanged; get_params() gives the constructor's settings."""
    _, reflection_lm, _ = lms
    student = dspy.ChainOfThought("question -> answer")
    before = student.predict.signature.instructions
    optimizer = OptoOptimizer(qa_metric, reflection_lm=reflection_lm, max_metric_calls=40)
    compiled = optimizer.compile(student, trainset=qa_rows(COUNTRIES[:6]))
    assert type(compiled) is type(student) and compiled is not student and compiled._compiled
    assert student.predict.signature.instructions == before and not getattr(student, "_compiled", False)
    assert optimizer.get_params()["metric"] is qa_metric


def test_gepa_keywords_without_an_equivalent_are_refused_when_made() -> None:
    with pytest.raises(OptoValueError, match="instruction_proposer=.*no equivalent|has no equivalent for instruction"):
        OptoOptimizer(qa_metric, instruction_proposer=lambda *a: {})
    with pytest.raises(OptoValueError, match="no option budgett"):
        OptoOptimizer(qa_metric, budgett=3)
    with pytest.raises(OptoValueError, match="one of auto, max_full_evals, max_metric_calls"):
        OptoOptimizer(qa_metric, auto="light", max_metric_calls=10)
    with pytest.raises(OptoValueError, match="auto must be one of"):
        OptoOptimizer(qa_metric, auto="huge")
