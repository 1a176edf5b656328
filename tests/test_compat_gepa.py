"""GEPA users' code, unchanged, under `opto.integrations.gepa.optimize`: the same call goes
to `gepa.optimize` and to opto's, with the same scripted models, data and budget, and
opto's held-out score must be no lower, at no more metric calls.

The task models answer right only when their instructions ask for the capital city; the
reflection model, asked by GEPA (its ``` prompt) or by opto (its JSON prompt), proposes
that instruction once it has seen a failure's feedback. Every adapter the installed gepa
ships that runs without external services is here: `DefaultAdapter` (a task model given
as a function and as a LiteLLM name), `AnyMathsAdapter` (LiteLLM, JSON answers), and a
two-component adapter of the kind GEPA's tutorials write (round robin over components).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from opto import MaxMetricCalls, OptoTypeError, OptoValueError
from opto.integrations import gepa as bridge
from opto.testing import FakeOpenAIServer

gepa = pytest.importorskip("gepa", reason="the gepa extra: pip install 'opto-agents[gepa]'")
from gepa.adapters.anymaths_adapter.anymaths_adapter import AnyMathsAdapter  # noqa: E402
from gepa.adapters.default_adapter.default_adapter import DefaultAdapter  # noqa: E402
from gepa.core.adapter import EvaluationBatch  # noqa: E402

CAPITALS = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Peru": "Lima", "Japan": "Tokyo",
            "Kenya": "Nairobi", "Egypt": "Cairo", "Chile": "Santiago", "Ghana": "Accra", "Nepal": "Kathmandu",
            "Cuba": "Havana", "Fiji": "Suva", "Laos": "Vientiane", "Mali": "Bamako", "Oman": "Muscat",
            "Togo": "Lome", "Iran": "Tehran", "Iraq": "Baghdad"}  # fmt: skip
RULE = "Answer with the capital city of the country, in one word."
SEED = {"system_prompt": "You are a helpful assistant."}


def rows(countries: list[str]) -> list[dict[str, Any]]:
    return [{"input": f"What is the capital of {c}?", "answer": CAPITALS[c], "additional_context": {}}
            for c in countries]  # fmt: skip


TRAIN, VAL, TEST = rows(list(CAPITALS)[:6]), rows(list(CAPITALS)[6:12]), rows(list(CAPITALS)[12:])


def task_answer(system: str, question: str) -> str:
    country = question.rsplit(" ", 1)[-1].rstrip("?")
    return CAPITALS.get(country, "?") if "capital city" in system else f"{country} is a nice country."


def task_lm(messages: list[dict[str, Any]]) -> str:
    """The task model as a function, as GEPA's DefaultAdapter takes one."""
    return task_answer(messages[0]["content"], messages[-1]["content"])


def reflection_reply(prompt: str, components: tuple[str, ...] = ("system_prompt",)) -> str:
    """GEPA's prompt gets a ``` block; opto's a JSON suggestion for the components it may change."""
    if "within ``` blocks" in prompt:
        return f"```\n{RULE}\n```" if "incorrect" in prompt or "expected" in prompt else "```\nBe helpful.\n```"
    editable = [name for name in components if f"## {name}" in prompt] or list(components)
    return json.dumps({"reasoning": "the answers were not capitals", "suggestion": {editable[0]: RULE}})


def reflection_lm(prompt: str) -> str:
    return reflection_reply(prompt)


def held_out(adapter: Any, candidate: dict[str, str]) -> float:
    scores = adapter.evaluate(TEST, candidate, False).scores
    return sum(scores) / len(scores)


def run_both(budget: int, **call: Any) -> tuple[Any, Any]:
    """The same `gepa.optimize` call, to GEPA and to opto's bridge."""
    native = gepa.optimize(**call, max_metric_calls=budget, display_progress_bar=False, seed=0)
    ours = bridge.optimize(**call, max_metric_calls=budget, display_progress_bar=False, seed=0)
    return native, ours


def assert_no_worse(native: Any, ours: Any, adapter: Any, budget: int, batch: int = 3) -> None:
    assert held_out(adapter, ours.best_candidate) >= held_out(adapter, native.best_candidate)
    assert ours.total_metric_calls <= max(native.total_metric_calls, budget + batch)
    assert ours.candidates[ours.best_idx] == ours.best_candidate  # GEPA's fields, consistent
    assert len(ours.val_aggregate_scores) == len(ours.candidates) == len(ours.parents)


def test_default_adapter_with_a_task_function_matches_gepa_with_the_same_call() -> None:
    call = dict(seed_candidate=SEED, trainset=TRAIN, valset=VAL, task_lm=task_lm, reflection_lm=reflection_lm)
    native, ours = run_both(60, **call)
    assert_no_worse(native, ours, DefaultAdapter(model=task_lm), 60)
    assert ours.best_candidate["system_prompt"] == RULE and held_out(DefaultAdapter(model=task_lm), RULE_C) == 1.0
    usage = ours.result.usage_by_model
    assert usage["task_lm"].calls == ours.total_metric_calls  # every task-model call, one per metric call


RULE_C = {"system_prompt": RULE}


def test_positional_order_and_gepa_keywords_are_gepa_s() -> None:
    found = bridge.optimize(SEED, TRAIN, VAL, None, task_lm, None, reflection_lm, None, "current_best",
                            max_metric_calls=80, reflection_minibatch_size=2, module_selector="round_robin",
                            perfect_score=1.0, skip_perfect_score=True, raise_on_exception=True)  # fmt: skip
    assert found.best_candidate == RULE_C and found.total_metric_calls <= 80


def test_a_litellm_task_model_s_calls_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")

    def reply(body: dict[str, Any]) -> str:
        return task_answer(body["messages"][0]["content"], body["messages"][-1]["content"])

    with FakeOpenAIServer(reply) as server:
        monkeypatch.setenv("OPENAI_API_BASE", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        found = bridge.optimize(SEED, TRAIN, VAL, task_lm="openai/task-model", reflection_lm=reflection_lm,
                                max_metric_calls=40)  # fmt: skip
        sent = len(server.chat_requests)
    assert found.best_candidate == RULE_C
    assert found.result.usage_by_model["openai/task-model"].calls == sent == found.total_metric_calls


def test_any_maths_adapter_runs_under_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")

    def reply(body: dict[str, Any]) -> str:
        answer = task_answer(body["messages"][0]["content"], body["messages"][-1]["content"])
        return json.dumps({"final_answer": answer, "solution_pad": "I know it."})

    with FakeOpenAIServer(reply) as server:
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        adapter = AnyMathsAdapter("openai/maths-model", api_base=server.base_url)
        native, ours = run_both(48, seed_candidate=SEED, trainset=TRAIN, valset=VAL, adapter=adapter,
                                reflection_lm=reflection_lm)  # fmt: skip
        assert_no_worse(native, ours, adapter, 48)
        assert held_out(adapter, ours.best_candidate) == 1.0


class FactsAndStyle:
    """Two components, each half of the score: `facts` must ask for the capital and `style`
    for one word; its reflective records say what was expected."""

    propose_new_texts: Any = None  # GEPA reads it: None, its own reflection proposes

    def __init__(self) -> None:
        self.reflected_for: list[list[str]] = []

    def evaluate(self, batch: list[dict[str, Any]], candidate: dict[str, str], capture_traces: bool = False) -> Any:
        outputs, scores = [], []
        for row in batch:
            known = "capital city" in candidate["facts"]
            answer = row["answer"] if known else "unknown"
            outputs.append(answer)
            scores.append(0.5 * known + 0.5 * ("one word" in candidate["style"]))
        traces = [{"row": r, "out": o, "score": s} for r, o, s in zip(batch, outputs, scores)]
        return EvaluationBatch(outputs=outputs, scores=scores, trajectories=traces if capture_traces else None)

    def make_reflective_dataset(self, candidate: dict[str, str], eval_batch: Any, components: list[str]) -> Any:
        self.reflected_for.append(list(components))
        records = [{"Inputs": t["row"]["input"], "Generated Outputs": t["out"],
                    "Feedback": "correct" if t["score"] else f"incorrect: expected {t['row']['answer']} in one word"}
                   for t in eval_batch.trajectories]  # fmt: skip
        return {name: records for name in components}


def two_component_reply(prompt: str) -> str:
    """Fixes the component it is asked about: GEPA shows one current text, opto marks the
    ones it may change as trainable."""
    texts = {"facts": "Give the capital city.", "style": "Answer in one word."}
    if "within ``` blocks" in prompt:
        current = prompt.split("```", 2)[1]
        return f"```\n{texts['facts'] if 'know' in current or 'capital' in current else texts['style']}\n```"
    editable = re.findall(r"## (facts|style)\n- type: [^\n]*\n- trainable: yes", prompt)
    return json.dumps({"reasoning": "fix it", "suggestion": {name: texts[name] for name in editable}})


def test_a_two_component_adapter_round_robin_asks_for_one_component_at_a_time() -> None:
    seed = {"facts": "Say what you know.", "style": "Answer fully."}
    adapter = FactsAndStyle()
    call = dict(seed_candidate=seed, trainset=TRAIN, valset=VAL, adapter=adapter, reflection_lm=two_component_reply,
                module_selector="round_robin")  # fmt: skip
    native, ours = run_both(90, **call)
    test = adapter.evaluate(TEST, ours.best_candidate).scores
    assert sum(test) / len(test) >= sum(adapter.evaluate(TEST, native.best_candidate).scores) / len(test)
    assert sum(test) / len(test) == 1.0
    assert ours.total_metric_calls <= max(native.total_metric_calls, 93)
    assert adapter.reflected_for and all(len(names) == 1 for names in adapter.reflected_for)


def test_reflective_records_are_made_only_when_a_step_proposes() -> None:
    class Counting(FactsAndStyle):
        def __init__(self) -> None:
            super().__init__()
            self.evaluate_calls: list[int] = []

        def evaluate(self, batch: list[dict[str, Any]], candidate: dict[str, str], capture_traces: bool = False):
            self.evaluate_calls.append(len(batch))
            return super().evaluate(batch, candidate, capture_traces)

    adapter = Counting()
    found = bridge.optimize({"facts": "", "style": ""}, TRAIN, VAL, adapter, reflection_lm=two_component_reply,
                            max_metric_calls=60)  # fmt: skip
    proposals = found.result.steps - found.result.no_update
    assert len(adapter.reflected_for) <= found.result.steps and len(adapter.reflected_for) >= 1
    assert proposals >= 1 and max(adapter.evaluate_calls) > 1  # batches, not one instance a call


def test_an_adapters_propose_new_texts_writes_the_texts() -> None:
    class Proposing(FactsAndStyle):
        def propose_new_texts(self, candidate: dict[str, str], dataset: Any, components: list[str]) -> dict[str, str]:
            return {name: {"facts": "Give the capital city.", "style": "one word"}[name] for name in components}

    found = bridge.optimize({"facts": "", "style": ""}, TRAIN, VAL, Proposing(), max_metric_calls=60,
                            module_selector="all")  # fmt: skip
    assert found.proposer == "adapter" and found.best_candidate == {"facts": "Give the capital city.", "style": "one word"}
    ours = bridge.optimize({"facts": "", "style": ""}, TRAIN, VAL, Proposing(), reflection_lm=two_component_reply,
                           max_metric_calls=60, module_selector="all", proposer="opto")  # fmt: skip
    assert ours.proposer == "opto" and ours.best_candidate == {"facts": "Give the capital city.",
                                                               "style": "Answer in one word."}  # fmt: skip
    with pytest.raises(OptoValueError, match='proposer="adapter", but the adapter has no propose_new_texts'):
        bridge.optimize(SEED, TRAIN, task_lm=task_lm, reflection_lm=reflection_lm, proposer="adapter")


def test_gepa_s_data_loader_is_read() -> None:
    from gepa.core.data_loader import ListDataLoader

    found = bridge.optimize(SEED, ListDataLoader(TRAIN), ListDataLoader(VAL), task_lm=task_lm,
                            reflection_lm=reflection_lm, max_metric_calls=40)  # fmt: skip
    assert found.best_candidate == RULE_C


def test_arguments_without_an_equivalent_are_refused_with_why() -> None:
    with pytest.raises(OptoValueError, match="use_cloudpickle=True: opto never pickles"):
        bridge.optimize(SEED, TRAIN, task_lm=task_lm, reflection_lm=reflection_lm, use_cloudpickle=True)
    with pytest.raises(OptoValueError, match="stop_callbacks=.*MaxMetricCalls"):
        bridge.optimize(SEED, TRAIN, task_lm=task_lm, reflection_lm=reflection_lm, stop_callbacks=[lambda s: True])
    with pytest.raises(OptoValueError, match="candidate_selection_strategy must be one of"):
        bridge.optimize(SEED, TRAIN, task_lm=task_lm, reflection_lm=reflection_lm, candidate_selection_strategy="x")
    with pytest.raises(OptoValueError, match="adapter=, or a task_lm="):
        bridge.optimize(SEED, TRAIN, reflection_lm=reflection_lm)
    with pytest.raises(OptoTypeError, match="GEPA DataLoader"):
        bridge.optimize(SEED, 42, task_lm=task_lm, reflection_lm=reflection_lm)
    with pytest.raises(OptoValueError, match="reflection needs a model"):
        bridge.optimize(SEED, TRAIN, task_lm=task_lm, max_metric_calls=10)


def test_max_metric_calls_stops_at_the_budget() -> None:
    for budget in (20, 45):
        found = bridge.optimize(SEED, TRAIN, VAL, task_lm=task_lm, reflection_lm=reflection_lm, max_metric_calls=budget)
        assert budget - 12 <= found.total_metric_calls <= budget + 3
        assert "MaxMetricCalls" in (found.result.stopped_reason or "")
    assert repr(MaxMetricCalls(5)) == "MaxMetricCalls(5)"


def test_gepa_s_signature_is_the_one_the_bridge_maps() -> None:
    import inspect

    assert tuple(inspect.signature(gepa.optimize).parameters) == bridge.GEPA_ORDER
