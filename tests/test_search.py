"""Search strategies: candidates per proposal ("merged", "each", "both") and
minibatch-first validation, greedy and Pareto."""

from __future__ import annotations

import json
from pathlib import Path
import re
from typing import Any

import pytest

import world
from opto import Agent, Parameter, ScriptedModel
from opto import Budget, ExactMatchGuide, MinibatchFirst, RunDir
from opto.search import EachProposal


def fix_own_instance(messages: list[dict[str, Any]]) -> str:
    """The optimizer proposes the level that makes its own instance right: level x + 1."""
    x = int(re.search(r"# Input\n(-?\d+)", messages[-1]["content"]).group(1))
    return json.dumps({"reasoning": f"cover {x}", "suggestion": {"system_prompt": f"level {x + 1}"}})


def trainer_with(**kwargs: Any) -> tuple[Any, Any, Any]:
    trainer, agent, _, brain = world.make_level_trainer(level=0, brain_kwargs={"optimizer": fix_own_instance},
                                                        **kwargs)
    return trainer, agent, brain


def events(run_dir: Any, kind: str) -> list[Any]:
    return list(RunDir(run_dir).events(kind))


def test_each_proposal_is_a_candidate_of_its_own_and_the_aggregator_is_not_asked(tmp_path):
    trainer, agent, brain = trainer_with(candidates="each")
    trainer.train(ExactMatchGuide(), world.dataset([1, 4, 2]), batch_size=3, run_dir=tmp_path, progress=False,
                  shuffle=False)
    assert not world.requests_of(brain, "aggregator")
    proposals = {p.proposal_id: p.update["system_prompt"] for p in events(tmp_path, "proposal")}
    candidates = events(tmp_path, "candidate")
    assert sorted(c.update["system_prompt"] for c in candidates) == ["level 2", "level 3", "level 5"]
    for candidate in candidates:
        assert [proposals[pid] for pid in candidate.source_proposals] == [candidate.update["system_prompt"]]
    decisions = events(tmp_path, "decision")
    assert len(decisions) == 3 and agent.system_prompt.value == "level 5"  # the best of the three, level 5, covers all


def test_equal_proposals_make_one_candidate_that_lists_them_all():
    from opto.search.proposers import Proposal

    same = [Proposal(update={"p": "a"}, instance_id=str(i)) for i in range(3)]
    other = Proposal(update={"p": "b"}, instance_id="3")
    import asyncio

    found = asyncio.run(EachProposal().candidates([], [*same, other, Proposal(update={}, instance_id="4")], 1.0))
    assert [c.update for c in found] == [{"p": "a"}, {"p": "b"}]
    assert found[0].source_proposals == [p.proposal_id for p in same]


def test_both_adds_the_distinct_proposals_to_the_merged_candidates(tmp_path):
    trainer, _, brain = trainer_with(candidates="both")
    trainer.train(ExactMatchGuide(), world.dataset([1, 4]), batch_size=2, run_dir=tmp_path, progress=False,
                  shuffle=False)
    assert len(world.requests_of(brain, "aggregator")) == 1
    finals = [c for c in events(tmp_path, "candidate") if c.final]
    # the aggregator's merge first, then each proposal not equal to it
    merged, *each = finals
    assert {c.update["system_prompt"] for c in each} == {"level 2", "level 5"} - {merged.update["system_prompt"]}
    assert all(len(c.source_proposals) == 1 for c in each)


def test_an_unknown_candidates_setting_is_refused():
    with pytest.raises(ValueError, match=r"candidates must be one of 'merged', 'each', 'both'"):
        trainer_with(candidates="all")


def test_minibatch_first_validates_on_the_dataset_only_what_wins_on_the_batch(tmp_path):
    validation = world.dataset(range(6))
    trainer, agent, _ = trainer_with(candidates="each", validation=MinibatchFirst(validation))
    # Step 1, batch [1, 3] under level 0 (both wrong): "level 2" and "level 4" both win on the
    # batch and go on to the dataset, where level 4 is best. Step 2, batch [0, 2] under level 4
    # (both right): "level 1" and "level 3" cannot win there, and are never validated.
    trainer.train(ExactMatchGuide(), world.dataset([1, 3, 0, 2]), batch_size=2, run_dir=tmp_path, progress=False,
                  shuffle=False)
    decisions = events(tmp_path, "decision")
    rollouts = events(tmp_path, "rollout")
    for decision in decisions:
        screened = [r for r in rollouts if r.phase == "screening" and r.candidate_id == decision.candidate_id]
        validated = [r for r in rollouts if r.phase == "validation" and r.candidate_id == decision.candidate_id]
        assert len(screened) == 2 and decision.validation == "minibatch_first"
        if decision.stage == "minibatch":
            assert not decision.accepted and not validated and decision.rollouts_saved == 6
            assert "not validated on the dataset" in decision.reason
        else:
            assert decision.stage == "dataset" and len(validated) == 6 and decision.rollouts_saved == 0
    stages = [d.stage for d in decisions]
    assert stages == ["dataset", "dataset", "minibatch", "minibatch"]
    assert agent.system_prompt.value == "level 4"


def test_minibatch_first_works_with_pareto_selection(tmp_path):
    validation = world.dataset(range(6))
    trainer, agent, _ = trainer_with(candidates="each", validation=MinibatchFirst(validation), selection="pareto")
    trainer.train(ExactMatchGuide(), world.dataset([1, 3, 0, 2]), batch_size=2, run_dir=tmp_path, progress=False,
                  shuffle=False)
    pooled = {e.candidate_id for e in events(tmp_path, "pool")}
    for decision in events(tmp_path, "decision"):
        assert (decision.candidate_id in pooled) == (decision.stage == "dataset")
    assert agent.system_prompt.value == "level 4"


def test_the_budget_check_knows_each_makes_no_aggregator_call():
    trainer, *_ = trainer_with(candidates="each")
    with pytest.raises(ValueError, match=r"at least 6 .*\(2 for rollouts, 2 for proposals, 2 for validation;"):
        trainer.train(ExactMatchGuide(), world.dataset([1, 4]), batch_size=2, budget=Budget(max_calls=5), progress=False)


def test_the_report_says_how_many_validations_minibatch_first_saved(tmp_path):
    from opto.report.markdown import write_report

    trainer, *_ = trainer_with(candidates="each", validation=MinibatchFirst(world.dataset(range(6))))
    trainer.train(ExactMatchGuide(), world.dataset([1, 3, 0, 2]), batch_size=2, run_dir=tmp_path, progress=False,
                  shuffle=False)
    summary = write_report(tmp_path)
    assert (summary.screened_out, summary.rollouts_saved) == (2, 12)
    assert "2 of 4 candidates lost on their batch" in (tmp_path / "report.md").read_text()


class TwoKnobs(Agent):
    """Right on even x when a == "A", on odd x when b == "B": two parameters, two lineages."""

    def __init__(self) -> None:
        self.model = ScriptedModel(lambda messages: messages[-1]["content"], name="agent-model")
        self.a = Parameter("a0", description="the even knob")
        self.b = Parameter("b0", description="the odd knob")

    async def forward(self, x: int) -> str:
        needed = self.a.value == "A" if x % 2 == 0 else self.b.value == "B"
        reply = await self.model.complete([{"role": "user", "content": str(2 * x) if needed else "wrong"}])
        return reply.text


def knob_for_own_instance(messages: list[dict[str, Any]]) -> str:
    """Fixes only the knob its instance needs: lineages that change different parameters."""
    x = int(re.search(r"# Input\n(-?\d+)", messages[-1]["content"]).group(1))
    return json.dumps({"suggestion": {"a": "A"} if x % 2 == 0 else {"b": "B"}})


def test_merge_every_combines_two_lineages_by_the_parameters_each_changed(tmp_path):
    from opto import AggregatedUpdate, Optimizer

    trainer = AggregatedUpdate(TwoKnobs(), Optimizer(ScriptedModel(knob_for_own_instance, name="brain")),
                               candidates="each", selection="pareto", merge_every=2,
                               validation=world.dataset(range(4)), proposals="per_instance")
    result = trainer.train(ExactMatchGuide(), world.dataset([0, 1, 2, 3]), batch_size=2, run_dir=tmp_path,
                           progress=False, shuffle=False)
    merges = [c for c in events(tmp_path, "candidate") if c.merge_parents]
    assert len(merges) == 1 and merges[0].step == 2 and merges[0].update in ({"a": "A"}, {"b": "B"})
    assert "common ancestor start" in merges[0].reasoning
    pooled = {e.candidate_id: e for e in events(tmp_path, "pool")}
    merged = pooled[merges[0].candidate_id]
    assert {merged.parent_id, merged.merge_parent_id} == set(merges[0].merge_parents)
    assert merged.values == {"a": "A", "b": "B"} and merged.pool_mean == 1.0
    assert result.final_parameters == {"a": "A", "b": "B"}
    assert not [p for p in events(tmp_path, "proposal") if p.step == 2]  # a merge step asks for no proposals


def test_merge_every_needs_pareto_selection():
    with pytest.raises(ValueError, match="selection='pareto'"):
        trainer_with(merge_every=2)


def test_the_report_draws_the_lineage_with_both_parents_of_a_merge(tmp_path):
    from opto import AggregatedUpdate, Optimizer
    from opto.report.markdown import write_report

    trainer = AggregatedUpdate(TwoKnobs(), Optimizer(ScriptedModel(knob_for_own_instance, name="brain")),
                               candidates="each", selection="pareto", merge_every=2,
                               validation=world.dataset(range(4)), proposals="per_instance")
    trainer.train(ExactMatchGuide(), world.dataset([0, 1, 2, 3]), batch_size=2, run_dir=tmp_path, progress=False,
                  shuffle=False)
    summary = write_report(tmp_path)
    pool = events(tmp_path, "pool")
    assert summary.lineage_png and Path(summary.lineage_png).stat().st_size > 0
    assert summary.lineage_nodes == len(pool)
    assert summary.lineage_edges == sum(1 for e in pool if e.parent_id) + sum(1 for e in pool if e.merge_parent_id)


class Styled(Agent):
    """Always right, but the "long" style makes three model calls where "short" makes one."""

    def __init__(self) -> None:
        self.model = ScriptedModel(lambda messages: messages[-1]["content"], name="agent-model")
        self.style = Parameter("unset", description="how to answer")

    async def forward(self, x: int) -> str:
        if self.style.value == "unset":
            return "wrong"
        for _ in range(3 if self.style.value == "long" else 1):
            reply = await self.model.complete([{"role": "user", "content": str(2 * x)}])
        return reply.text


def style_by_parity(messages: list[dict[str, Any]]) -> str:
    x = int(re.search(r"# Input\n(-?\d+)", messages[-1]["content"]).group(1))
    return json.dumps({"suggestion": {"style": "long" if x % 2 else "short"}})


@pytest.mark.parametrize("objectives", [("score",), ("score", "cost")])
def test_cost_as_an_objective_keeps_the_cheaper_of_equal_candidates(objectives, tmp_path):
    from opto import AggregatedUpdate, Optimizer
    from opto.report.markdown import write_report

    trainer = AggregatedUpdate(Styled(), Optimizer(ScriptedModel(style_by_parity, name="brain")), candidates="each",
                               selection="pareto", objectives=objectives, validation=world.dataset(range(4)), proposals="per_instance")
    result = trainer.train(ExactMatchGuide(), world.dataset([1, 0]), batch_size=2, run_dir=tmp_path, progress=False,
                           shuffle=False)
    pooled = {e.values["style"]: e for e in events(tmp_path, "pool")}
    assert pooled["short"].pool_mean == pooled["long"].pool_mean == 1.0
    if objectives == ("score",):
        assert result.final_parameters == {"style": "long"}  # equal means: the earliest (proposed for x=1)
        assert pooled["long"].costs == {}
    else:
        assert pooled["short"].costs["cost"] < pooled["long"].costs["cost"]
        front = trainer.pool.front()  # "long" is dominated; the start stays as the cheapest (no calls at all)
        assert pooled["short"].candidate_id in front and pooled["long"].candidate_id not in front
        assert result.final_parameters == {"style": "short"}
        summary = write_report(tmp_path)
        assert summary.cost_png and Path(summary.cost_png).stat().st_size > 0


def test_objectives_are_checked():
    with pytest.raises(ValueError, match="'score' followed by"):
        trainer_with(selection="pareto", validation=world.dataset(range(2)), objectives=("cost",))
    with pytest.raises(ValueError, match="selection='pareto'"):
        trainer_with(objectives=("score", "cost"))
