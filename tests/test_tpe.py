"""`TPEProposer`: numeric and categorical knobs by Bayesian search, told every candidate's score."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

pytest.importorskip("optuna", reason="the `tpe` extra is part of the test install")

from opto import Agent, AggregatedUpdate, Constraint, ExactMatchGuide, MaxCalls, Optimizer, Parameter  # noqa: E402
from opto import RunDir, ScriptedModel  # noqa: E402
from opto.search import TPEProposer  # noqa: E402
from world import ledger_of  # noqa: E402

# The agent is right on example i when its knob is within 0.08 of 0.7 (and its mode is "exact").
DATA = [{"x": i, "info": "yes", "id": f"e{i}"} for i in range(24)]


class Knobs(Agent):
    def __init__(self) -> None:
        self.model = ScriptedModel(lambda messages: messages[-1]["content"], name="echo")  # counts the calls
        self.knob = Parameter(0.1, constraint=Constraint(min=0.0, max=1.0), description="a float knob")
        self.mode = Parameter("loose", constraint=Constraint(choices=("loose", "exact")))
        self.depth = Parameter(3, constraint=Constraint(min=1, max=9))
        self.prompt = Parameter("Answer.", description="text TPE leaves alone")

    async def forward(self, x: int) -> str:
        near = abs(self.knob.value - 0.7) < 0.08 or (x % 3 == 0 and abs(self.knob.value - 0.7) < 0.2)
        verdict = "yes" if near and self.mode.value == "exact" else "no"
        return (await self.model.complete([{"role": "user", "content": verdict}])).text


def trainer(**kwargs) -> AggregatedUpdate:
    return AggregatedUpdate(Knobs(), TPEProposer(seed=3), validation=DATA[:12], **kwargs)


def test_tpe_searches_the_knobs_it_can_and_learns_from_the_scores(tmp_path):
    found = trainer()
    result = found.train(ExactMatchGuide(), DATA[12:], batch_size=2, num_epochs=5, progress=False, run_dir=tmp_path)
    proposals = RunDir(tmp_path).events("proposal")
    assert len(proposals) == result.steps  # once a step, not once per instance
    for proposal in proposals:
        assert set(proposal.update) == {"knob", "mode", "depth"} and proposal.extraction_method == "tpe"
        assert 0.0 <= proposal.update["knob"] <= 1.0 and proposal.update["mode"] in ("loose", "exact")
        assert isinstance(proposal.update["depth"], int) and 1 <= proposal.update["depth"] <= 9
    told = found.proposers[0].state_dict()["trials"]
    assert len(told) == result.steps and sum(t["value"] is not None for t in told) >= result.steps // 2
    assert result.final_parameters["mode"] == "exact" and abs(result.final_parameters["knob"] - 0.7) < 0.2
    assert result.final_parameters["prompt"] == "Answer."


def test_a_stopped_tpe_run_resumes_to_the_same_ledger(tmp_path):
    def run(run_dir, **kwargs):
        return trainer().train(ExactMatchGuide(), DATA[12:], batch_size=4, num_epochs=3, progress=False,
                               run_dir=run_dir, **kwargs)

    whole = run(tmp_path / "whole")
    stopped = run(tmp_path / "parts", stop=MaxCalls(60))
    assert stopped.stopped_reason and stopped.steps < whole.steps
    resumed = run(tmp_path / "parts", resume=True)
    assert resumed.final_parameters == whole.final_parameters
    assert ledger_of(tmp_path / "parts") == ledger_of(tmp_path / "whole")
    updates = [json.dumps(e.update, sort_keys=True) for e in RunDir(tmp_path / "parts").events("proposal")]
    assert updates == [json.dumps(e.update, sort_keys=True) for e in RunDir(tmp_path / "whole").events("proposal")]


def test_text_and_numbers_are_tuned_together():
    def optimizer(messages):
        return json.dumps({"reasoning": "r", "suggestion": {"prompt": "Answer yes or no."}})

    agent = Knobs()
    both = AggregatedUpdate(agent, [Optimizer(ScriptedModel(optimizer), name="llm"), TPEProposer(seed=1)],
                            validation=DATA[:12], candidates="each")
    both.train(ExactMatchGuide(), DATA[12:], batch_size=4, num_epochs=2, progress=False)
    assert {"llm", "tpe"} <= {p.name for p in both.proposers}
    assert len(both.proposers[1].state_dict()["trials"]) == 6  # asked once in each of the 6 steps


def test_what_tpe_cannot_search_is_an_error_that_says_what_to_add():
    agent = Knobs()
    with pytest.raises(ValueError, match="cannot search 'prompt'"):
        TPEProposer(["prompt"]).space(agent.parameters())
    with pytest.raises(ValueError, match="no parameter 'knobb'"):
        TPEProposer(["knobb"]).space(agent.parameters())
    with pytest.raises(TypeError, match="list of names"):
        TPEProposer("knob")
    assert set(TPEProposer().space(agent.parameters())) == {"knob", "mode", "depth"}
    assert set(TPEProposer(["knob"]).space(agent.parameters())) == {"knob"}


def test_without_optuna_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(ImportError, match=r"opto-agents\[tpe\]"):
        asyncio.run(TPEProposer().propose_batch(Knobs().parameters(), []))
