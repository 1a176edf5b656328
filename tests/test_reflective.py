"""Reflective proposals (one optimizer call a step that sees the batch's failures together)
and component selection (one parameter a step)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from opto import Agent, AggregatedUpdate, ExactMatchGuide, Optimizer, Parameter, RunDir, ScriptedModel
from opto.search.components import RoundRobin, focused
from opto.search.registry import make
from world import dataset, make_level_trainer, requests_of

TRAIN = dataset([0, 1, 2, 3, 4, 5, 6, 7])


def test_a_reflective_step_asks_once_with_every_failure_and_one_success(tmp_path):
    trainer, _, _, brain = make_level_trainer(level=2, proposals="reflective")
    trainer.train(ExactMatchGuide(), TRAIN[:4], batch_size=4, shuffle=False, progress=False, run_dir=tmp_path,
                  min_score=0.0)
    asked = requests_of(brain, "optimizer")
    assert len(asked) == 1  # one call for the batch, not one per instance
    prompt = asked[0]["messages"][-1]["content"]
    assert prompt.count("(went wrong)") == 2 and prompt.count("(went right)") == 1  # x2, x3 fail; x0 shown
    assert "# Examples" in prompt and '"level 2"' in prompt
    assert not requests_of(brain, "aggregator")  # one reflective proposal: nothing to merge
    proposal = RunDir(tmp_path).events("proposal")[0]
    assert proposal.instance_ids == ["x2", "x3", "x0"] and proposal.instance_id == "x2"
    candidate = RunDir(tmp_path).events("candidate")[0]
    assert candidate.source_proposals == [proposal.proposal_id]


def test_a_batch_where_everything_went_right_costs_no_proposal_call():
    trainer, _, _, brain = make_level_trainer(level=10, proposals="reflective")
    result = trainer.train(ExactMatchGuide(), TRAIN[:4], batch_size=4, progress=False)
    assert result.no_update == 1 and not requests_of(brain, "optimizer")


def test_skip_perfect_spares_the_per_instance_calls_on_successes():
    trainer, _, _, brain = make_level_trainer(level=2)
    trainer.proposers[0].skip_perfect = True
    trainer.train(ExactMatchGuide(), TRAIN[:4], batch_size=4, shuffle=False, progress=False, min_score=0.0)
    shown = [re.search(r"# Input\n(\d+)", r["messages"][-1]["content"]).group(1)
             for r in requests_of(brain, "optimizer")]
    assert sorted(shown) == ["2", "3"]


class TwoPrompts(Agent):
    def __init__(self, model: ScriptedModel) -> None:
        self.model = model
        self.first = Parameter("a0", description="the first prompt")
        self.second = Parameter("b0", description="the second prompt")

    async def forward(self, x: int) -> str:
        return (await self.model.complete([{"role": "user", "content": f"{self.first.value} {self.second.value}"}])).text


def test_round_robin_proposes_for_one_parameter_a_step_and_shows_the_others_as_fixed():
    seen: list[dict[str, str]] = []

    def optimizer(messages: list[dict[str, Any]]) -> str:
        text = messages[-1]["content"]
        blocks = dict(re.findall(r"## (first|second)\n- type: str\n- trainable: (yes|no \(fixed\))", text))
        seen.append(blocks)
        # It asks to change both; only the one in focus may change.
        return json.dumps({"reasoning": "both", "suggestion": {"first": f"a{len(seen)}", "second": f"b{len(seen)}"}})

    agent = TwoPrompts(ScriptedModel(lambda m: "wrong", name="agent"))
    trainer = AggregatedUpdate(agent, Optimizer(ScriptedModel(optimizer, name="brain")), validation="none",
                               proposals="reflective", components="round_robin", final_check=None)
    trainer.train(ExactMatchGuide(), [{"x": i, "info": "right", "id": f"e{i}"} for i in range(4)], batch_size=2,
                  progress=False)
    assert seen == [{"first": "yes", "second": "no (fixed)"}, {"first": "no (fixed)", "second": "yes"}]
    assert agent.stored_values() == {"first": "a1", "second": "b2"}


def test_focused_copies_leave_the_agents_parameters_alone():
    agent = TwoPrompts(ScriptedModel(lambda m: "", name="m"))
    shown = focused(agent.parameters(), ["second"])
    assert [p.trainable for p in shown] == [False, True]
    assert [p.trainable for p in agent.parameters()] == [True, True]
    assert RoundRobin().select(["a", "b", "c"], 4) == ["a"]


@pytest.mark.parametrize("bad", [{"proposals": "batch"}, {"components": "some"}, {"components": 3}])
def test_bad_search_options_are_refused_with_the_choices(bad):
    with pytest.raises(ValueError, match="must be"):
        make_level_trainer(**bad)
    with pytest.raises(ValueError, match="must be"):
        make("components", "none")


@pytest.mark.parametrize("options", [{"proposals": "reflective"},
                                     {"proposals": "reflective", "components": "round_robin"}])
def test_a_stopped_reflective_run_resumes_to_the_same_ledger(options, tmp_path):
    from opto import MaxCalls
    from world import ledger_of

    def run(run_dir, **kwargs):
        trainer, *_ = make_level_trainer(level=1, validation=dataset([0, 1, 2, 3]), **options)
        return trainer.train(ExactMatchGuide(), TRAIN, batch_size=2, num_epochs=2, seed=4, progress=False,
                             run_dir=run_dir, min_score=0.0, **kwargs)

    whole = run(tmp_path / "whole")
    stopped = run(tmp_path / "parts", stop=MaxCalls(30))
    assert stopped.stopped_reason and stopped.steps < whole.steps
    resumed = run(tmp_path / "parts", resume=True)
    assert resumed.final_parameters == whole.final_parameters
    assert ledger_of(tmp_path / "parts") == ledger_of(tmp_path / "whole")
