"""`TPEProposer`: numeric and categorical knobs by Bayesian search, told every candidate's score
(or, for one screened out on the batch or dropped in a race, its score where it stopped)."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

pytest.importorskip("optuna", reason="the `tpe` extra is part of the test install")

from opto import Agent, AggregatedUpdate, Constraint, ExactMatchGuide, MaxCalls, Optimizer, Parameter  # noqa: E402
from opto import RunDir, ScriptedModel  # noqa: E402
from opto.search import TPEProposer  # noqa: E402
from opto.search.validation import MinibatchFirst  # noqa: E402
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
    assert len(told) == result.steps and all(t["value"] is not None or t["partial"] is not None for t in told)
    assert result.final_parameters["mode"] == "exact" and abs(result.final_parameters["knob"] - 0.7) < 0.2
    assert result.final_parameters["prompt"] == "Answer."


def test_tpe_candidates_are_screened_on_the_batch_and_told_where_they_stopped(tmp_path):
    found = trainer()
    assert isinstance(found.validation, MinibatchFirst)  # the same cheap first look as an LLM's candidates
    found.train(ExactMatchGuide(), DATA[12:], batch_size=2, num_epochs=5, progress=False, run_dir=tmp_path)
    run = RunDir(tmp_path)
    decisions = {d.candidate_id: d for d in run.events("decision") if d.candidate_id is not None}
    candidate_of = {p: c.candidate_id for c in run.events("candidate") if c.final for p in c.source_proposals}
    trials = found.proposers[0].state_dict()["trials"]
    stages = []
    for proposal, trial in zip(run.events("proposal"), trials, strict=True):
        decision = decisions[candidate_of[proposal.proposal_id]]
        stages.append(decision.stage)
        if decision.stage == "dataset":  # validated on the whole set: told that score
            expected = {"value": decision.candidate_score, "partial": None}
        else:  # screened out on the batch, or dropped in the race: told its score there
            expected = {"value": None, "partial": decision.candidate_score}
            assert decision.rollouts_saved > 0
        assert trial == {"params": proposal.update, **expected}
    assert "minibatch" in stages and "dataset" in stages


def test_candidates_stopped_early_steer_the_draws():
    """Told only that draws near 0.7 won on their batch and the others lost there (pruned
    trials, no whole-set score), TPE draws near 0.7 (as failed trials, the draws stayed
    uniform: 5 of these 10 near 0.7)."""
    history = [
        {"params": {"knob": k / 40}, "value": None, "partial": 1.0 if abs(k / 40 - 0.7) < 0.1 else 0.0}
        for k in range(1, 40, 2)
    ]
    draws = []
    for seed in range(10):
        proposer = TPEProposer(["knob"], seed=seed)
        proposer.load_state_dict({"trials": history})
        [proposal] = asyncio.run(proposer.propose_batch(Knobs().parameters(), []))
        draws.append(proposal.update["knob"])
    assert sum(abs(d - 0.7) < 0.15 for d in draws) >= 8, draws


def test_a_history_from_before_screening_still_loads():
    proposer = TPEProposer(["knob"], n_startup_trials=1)
    old = [{"params": {"knob": 0.7}, "value": 1.0}, {"params": {"knob": 0.1}, "value": None}]  # no "partial"
    proposer.load_state_dict({"trials": old})
    [proposal] = asyncio.run(proposer.propose_batch(Knobs().parameters(), []))
    assert 0.0 <= proposal.update["knob"] <= 1.0 and "after 1 scored and 0 stopped early" in proposal.reasoning


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
