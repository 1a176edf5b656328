"""`opto.integrations.dspy.OptoOptimizer`: a DSPy program of two predictors compiled by
opto's search against `FakeOpenAIServer` (dspy is an optional extra)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from opto import OptoTypeError, RunDir
from opto.llm import OpenAIModel
from opto.testing import FakeOpenAIServer

dspy = pytest.importorskip("dspy", reason="the dspy extra: pip install 'opto-agents[dspy]'")
from opto.integrations.dspy import OptoOptimizer  # noqa: E402

CAPITALS = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Peru": "Lima", "Japan": "Tokyo",
            "Kenya": "Nairobi", "Egypt": "Cairo", "Chile": "Santiago"}  # fmt: skip

PROGRAM = '''
import dspy


class CapitalQA(dspy.Module):
    """Two predictors: one writes a search query, the other answers from it."""

    def __init__(self):
        super().__init__()
        self.make_query = dspy.Predict("question -> query")
        self.answer = dspy.Predict("question, query -> answer")

    def forward(self, question):
        query = self.make_query(question=question).query
        return self.answer(question=question, query=query)
'''


def fake_models(body: dict[str, Any]) -> str:
    """The program's LM answers with the capital only when the answering predictor's
    instructions ask for one; the optimizer asks for it."""
    system, last = body["messages"][0]["content"], body["messages"][-1]["content"]
    if "improve the parameters" in system:  # opto's optimizer, whichever model name it has
        return json.dumps({"reasoning": "the answers were not capitals",
                           "suggestion": {"answer": "Reply with the capital city only."}})  # fmt: skip
    country = next((c for c in CAPITALS if c in last), "France")
    if "[[ ## answer ## ]]" not in system:
        return f"[[ ## query ## ]]\ncapital of {country}\n\n[[ ## completed ## ]]"
    answer = CAPITALS[country] if "capital city" in system else f"{country} is a country."
    return f"[[ ## answer ## ]]\n{answer}\n\n[[ ## completed ## ]]"


def examples(countries: list[str]) -> list[Any]:
    return [dspy.Example(question=f"What is the capital of {c}?", answer=CAPITALS[c]).with_inputs("question")
            for c in countries]  # fmt: skip


def exact(example: Any, prediction: Any, trace: Any = None) -> Any:
    right = prediction.answer.strip() == example.answer
    return dspy.Prediction(score=float(right), feedback="right" if right else f"expected {example.answer}")


@pytest.fixture
def program_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    (tmp_path / "capital_qa.py").write_text(PROGRAM)
    monkeypatch.syspath_prepend(str(tmp_path))
    import capital_qa

    return capital_qa


def accuracy(program: Any, rows: list[Any]) -> float:
    return sum(program(**row.inputs()).answer.strip() == row.answer for row in rows) / len(rows)


def test_a_two_predictor_program_improves_on_held_out_examples_and_loads_in_a_fresh_process(
    tmp_path: Path, program_module: Any
) -> None:
    countries = list(CAPITALS)
    with FakeOpenAIServer(fake_models) as server:
        lm = dspy.LM("openai/program-lm", api_base=server.base_url, api_key="test-key", cache=False)
        dspy.configure(lm=lm)
        student = program_module.CapitalQA()
        test = examples(countries[6:])
        before = accuracy(student, test)
        optimizer = OpenAIModel("optimizer", base_url=server.base_url, api_key="test-key")
        teleprompter = OptoOptimizer(exact, model=optimizer, batch_size=3, run_dir=tmp_path / "run")
        compiled = teleprompter.compile(student, trainset=examples(countries[:3]), valset=examples(countries[3:6]))
        after = accuracy(compiled, test)
        assert before == 0.0 and after == 1.0
        assert "capital city" in compiled.answer.signature.instructions
        assert student.answer.signature.instructions != compiled.answer.signature.instructions  # a copy
        assert teleprompter.result is not None and teleprompter.result.accepted >= 1

        rollouts = [r for r in RunDir(tmp_path / "run").ledger() if r["type"] == "rollout"]
        assert rollouts and all(len(r["trace"]) == 2 for r in rollouts)  # both predictors' LM calls
        assert "[[ ## query ## ]]" in rollouts[0]["trace"][0]["response"]
        assert any(r["feedback"] == "expected " + r["info"]["answer"] for r in rollouts)

        compiled.save(str(tmp_path / "compiled.json"))
        script = textwrap.dedent(f"""
            import dspy, capital_qa
            dspy.configure(lm=dspy.LM("openai/program-lm", api_base={server.base_url!r}, api_key="k", cache=False))
            program = capital_qa.CapitalQA()
            program.load({str(tmp_path / "compiled.json")!r})
            print([program(question=q).answer for q in {[row.question for row in test]!r}])
        """)
        env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.strip() == repr([compiled(**row.inputs()).answer for row in test])
        optimizer.close()


def test_bad_inputs_are_refused_with_what_to_pass(program_module: Any) -> None:
    optimizer = OptoOptimizer(exact, model=OpenAIModel("optimizer", base_url="http://127.0.0.1:9/v1", api_key="k"))
    with pytest.raises(OptoTypeError, match="dspy.Example"):
        optimizer.compile(program_module.CapitalQA(), trainset=[{"question": "q", "answer": "a"}])
    with pytest.raises(OptoTypeError, match="dspy.Module"):
        optimizer.compile(object(), trainset=examples(["Peru"]))


def test_demos_come_from_successful_runs_with_each_predictors_own_fields(program_module: Any) -> None:
    with FakeOpenAIServer(fake_models) as server:
        dspy.configure(lm=dspy.LM("openai/program-lm", api_base=server.base_url, api_key="test-key", cache=False))
        optimizer = OpenAIModel("optimizer", base_url=server.base_url, api_key="test-key")
        teleprompter = OptoOptimizer(exact, model=optimizer, demos=True, max_demos=2, batch_size=3, num_epochs=3,
                                     validation="none")  # fmt: skip
        compiled = teleprompter.compile(program_module.CapitalQA(), trainset=examples(list(CAPITALS)[:3]))
        optimizer.close()
    query_demos, answer_demos = compiled.make_query.demos, compiled.answer.demos
    assert len(query_demos) == len(answer_demos) == 2
    assert set(query_demos[0].keys()) == {"question", "query"}  # the intermediate field, from the run itself
    assert set(answer_demos[0].keys()) == {"question", "query", "answer"}
    assert all(d.answer == CAPITALS[d.question.rsplit(" ", 1)[-1].rstrip("?")] for d in answer_demos)  # successes


def test_without_a_model_the_programs_own_lm_proposes(program_module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: LiteLLM's own price map
    with FakeOpenAIServer(fake_models) as server:
        dspy.configure(lm=dspy.LM("openai/program-lm", api_base=server.base_url, api_key="test-key", cache=False))
        compiled = OptoOptimizer(exact, batch_size=3).compile(
            program_module.CapitalQA(), trainset=examples(list(CAPITALS)[:3]), valset=examples(list(CAPITALS)[3:6])
        )
        asked = [r for r in server.chat_requests if "improve the parameters" in r["messages"][0]["content"]]
    assert asked and {r["model"] for r in asked} == {"program-lm"}  # through LiteLLM, with the LM's api_base
    assert "capital city" in compiled.answer.signature.instructions
