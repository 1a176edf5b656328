"""`opto.integrations.gepa.optimize`: a GEPA adapter under opto's search, with GEPA's own
`EvaluationBatch` (gepa is an optional extra) and a scripted optimizer."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from opto import OptoTypeError, OptoValueError, RunDir, ScriptedModel
from opto.integrations.gepa import optimize

gepa_adapter = pytest.importorskip("gepa.core.adapter", reason="the gepa extra: pip install 'opto-agents[gepa]'")

# Each country's capital; the "program" answers right only for the countries its
# instructions name, and the reflective records say which answer was expected.
CAPITALS = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Peru": "Lima", "Chile": "Santiago",
            "Japan": "Tokyo", "Kenya": "Nairobi", "Egypt": "Cairo"}  # fmt: skip


class CapitalsAdapter:
    """A two-component program: `instructions` lists the countries it knows; `style`
    must say "one word" for the answer to count."""

    def __init__(self) -> None:
        self.evaluated = 0

    def evaluate(self, batch: list[dict[str, str]], candidate: dict[str, str], capture_traces: bool = False) -> Any:
        self.evaluated += len(batch)
        outputs, scores = [], []
        for inst in batch:
            known = inst["country"] in candidate["instructions"]
            answer = CAPITALS[inst["country"]] if known else "I am not sure."
            outputs.append({"answer": answer})
            scores.append(1.0 if known and "one word" in candidate["style"] else 0.0)
        trajectories = [{"inst": i, "out": o, "score": s} for i, o, s in zip(batch, outputs, scores)]
        return gepa_adapter.EvaluationBatch(outputs=outputs, scores=scores,
                                            trajectories=trajectories if capture_traces else None)  # fmt: skip

    def make_reflective_dataset(self, candidate: dict[str, str], eval_batch: Any, components_to_update: list[str]):
        records = [{"Inputs": t["inst"]["country"], "Generated Outputs": t["out"]["answer"],
                    "Feedback": "right" if t["score"] else f"expected {CAPITALS[t['inst']['country']]}, in one word"}
                   for t in eval_batch.trajectories]  # fmt: skip
        return {name: records for name in components_to_update}


def optimizer_reply(messages: list[dict[str, Any]]) -> str:
    """Adds every failed country to `instructions` and asks for one word."""
    text = messages[-1]["content"]
    failed = re.findall(r"Inputs: (\w+)\nGenerated Outputs: I am not sure", text)
    current = re.search(r"## instructions.*?- current value: (\".*?\")\n", text, re.S)
    known = json.loads(current.group(1)) if current else ""
    return json.dumps({"reasoning": "name the countries", "suggestion": {
        "instructions": " ".join([known, *failed]).strip(), "style": "Answer in one word."}})  # fmt: skip


def data(names: list[str]) -> list[dict[str, str]]:
    return [{"country": name} for name in names]


def test_a_gepa_adapter_improves_under_opto_and_the_run_keeps_its_ledger(tmp_path):
    adapter = CapitalsAdapter()
    seed = {"instructions": "Known countries:", "style": "Answer fully."}
    found = optimize(
        seed, data(list(CAPITALS)[:6]), data(list(CAPITALS)), adapter, reflection_lm=ScriptedModel(optimizer_reply),
        num_epochs=2, run_dir=tmp_path / "run",
    )  # fmt: skip
    assert found.seed_candidate == seed and set(found.best_candidate) == {"instructions", "style"}
    assert "one word" in found.best_candidate["style"] and found.changed == ["instructions", "style"]
    assert found.result.accepted >= 1 and adapter.evaluated > 0
    before = adapter.evaluate(data(list(CAPITALS)), seed).scores
    after = adapter.evaluate(data(list(CAPITALS)), found.best_candidate).scores
    assert sum(after) > sum(before) == 0
    rollouts = [r for r in RunDir(tmp_path / "run").ledger() if r["type"] == "rollout"]
    assert rollouts and {"output", "score", "feedback"} <= set(rollouts[0]["output"])
    proposals = [r for r in RunDir(tmp_path / "run").ledger() if r["type"] == "proposal"]
    assert any("expected" in json.dumps(p["prompt_messages"]) for p in proposals)  # the reflective records


def test_bad_adapters_seeds_and_options_are_refused_with_what_to_pass():
    model = ScriptedModel(optimizer_reply)
    with pytest.raises(OptoTypeError, match="no make_reflective_dataset"):
        optimize({"a": "x"}, data(["Peru"]), adapter=object.__new__(type("Half", (), {"evaluate": lambda *a: None})),
                 model=model)  # fmt: skip
    with pytest.raises(OptoValueError, match="seed_candidate"):
        optimize({}, data(["Peru"]), adapter=CapitalsAdapter(), model=model)
    with pytest.raises(OptoValueError, match="no option batchsize"):
        optimize({"instructions": "", "style": ""}, data(["Peru"]), adapter=CapitalsAdapter(), model=model, batchsize=2)
