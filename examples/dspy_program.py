"""A DSPy program of two predictors, compiled by opto's search as a DSPy teleprompter.

`OptoOptimizer(metric, model=...).compile(program, trainset=..., valset=...)` is called as
DSPy's own optimizers are and returns the optimized program. Each predictor's
instructions are a parameter; the metric returns a score with feedback text (GEPA's
`dspy.Prediction(score=..., feedback=...)`), which the optimizer is shown; every LM call
the program makes is in the run's ledger. The compiled program saves and loads with
DSPy's own `save`/`load`. The program's LM (`dspy.LM`) and the optimizer (an opto
`OpenAIModel`) both talk to `FakeOpenAIServer`, so it runs offline.

    pip install "opto-agents[dspy]"
    python examples/dspy_program.py         # offline, a few seconds
"""

from __future__ import annotations

import json
import re

import dspy

from opto import RunDir
from opto.integrations.dspy import OptoOptimizer
from opto.llm import OpenAIModel
from opto.testing import FakeOpenAIServer

CAPITALS = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Peru": "Lima", "Japan": "Tokyo",
            "Kenya": "Nairobi", "Egypt": "Cairo", "Chile": "Santiago", "Ghana": "Accra"}  # fmt: skip


class CapitalQA(dspy.Module):
    """Writes a search query, then answers from the question and the query."""

    def __init__(self) -> None:
        super().__init__()
        self.make_query = dspy.Predict("question -> query")
        self.answer = dspy.Predict("question, query -> answer")

    def forward(self, question: str) -> dspy.Prediction:
        query = self.make_query(question=question).query
        return self.answer(question=question, query=query)


def fake_models(body: dict) -> str:
    """The program's LM writes a query, then names the capital only when the answering
    predictor's instructions ask for the capital city; the optimizer asks for it."""
    system, last = body["messages"][0]["content"], body["messages"][-1]["content"]
    if body["model"] == "optimizer":
        expected = re.findall(r"expected (\w+)", last)
        fix = "Reply with the capital city only, e.g. " + (expected[0] if expected else "Paris") + "."
        return json.dumps({"reasoning": "the answers were sentences", "suggestion": {"answer": fix}})
    country = next((c for c in CAPITALS if c in last), "France")
    if "[[ ## answer ## ]]" not in system:
        return f"[[ ## query ## ]]\ncapital of {country}\n\n[[ ## completed ## ]]"
    answer = CAPITALS[country] if "capital city" in system else f"{country} is a country in the world."
    return f"[[ ## answer ## ]]\n{answer}\n\n[[ ## completed ## ]]"


def metric(example: dspy.Example, prediction: dspy.Prediction, trace: object = None) -> dspy.Prediction:
    right = prediction.answer.strip() == example.answer
    return dspy.Prediction(score=float(right), feedback="right" if right else f"expected {example.answer}")


def main() -> None:
    rows = [dspy.Example(question=f"What is the capital of {country}?", answer=capital).with_inputs("question")
            for country, capital in CAPITALS.items()]  # fmt: skip
    train, validation, test = rows[:3], rows[3:6], rows[6:]
    with FakeOpenAIServer(reply=fake_models) as server:
        dspy.configure(lm=dspy.LM("openai/program-lm", api_base=server.base_url, api_key="test-key", cache=False))
        program = CapitalQA()
        before = sum(metric(r, program(**r.inputs())).score for r in test) / len(test)
        optimizer = OpenAIModel("optimizer", base_url=server.base_url, api_key="test-key")
        teleprompter = OptoOptimizer(metric, model=optimizer, batch_size=3, run_dir="runs/dspy-capitals")
        compiled = teleprompter.compile(program, trainset=train, valset=validation)
        after = sum(metric(r, compiled(**r.inputs())).score for r in test) / len(test)
        compiled.save("capitals.json")
        reloaded = CapitalQA()
        reloaded.load("capitals.json")
        same = [reloaded(**r.inputs()).answer for r in test] == [compiled(**r.inputs()).answer for r in test]
        optimizer.close()
    rollouts = [r for r in RunDir("runs/dspy-capitals").ledger() if r["type"] == "rollout"]
    print(f"held-out accuracy before {before:.2f} after {after:.2f}")
    print(f"answer's instructions: {compiled.answer.signature.instructions!r}")
    print(f"saved and loaded: the same answers: {same}")
    print(f"LM calls per rollout in the ledger: {sorted({len(r['trace']) for r in rollouts})}")


if __name__ == "__main__":
    main()
