"""Pareto candidate selection: the pool's front, sampling, the best mean, and training runs.

The world: an agent whose `skill` parameter lists the validation examples it solves
("v1 v2"); a scripted optimizer that proposes, for each current skill, a fixed next skill
(so the run is a function of the prompts, and resume needs no cache); an aggregator
that passes the one suggestion through. Which candidate is best on which example is
therefore known exactly.
"""

import json
import re

import numpy as np
import pytest

from opto import Agent, AggregatedUpdate, Aggregator, Budget, ExactMatchGuide, Optimizer, Parameter, RunDir
from opto.core.rollout import Rollout
from opto.llm import ScriptedModel
from opto.search.selection import CandidatePool
from opto.search.validation import DatasetValidation

NEXT_SKILL = {"": "v1 v2", "v1 v2": "v3", "v3": "v3 v4", "v3 v4": "v1 v2 v3"}
VALIDATION = [{"x": f"v{i}", "info": "yes", "id": f"v{i}"} for i in range(1, 5)]
TRAIN = [{"x": f"t{i}", "info": "yes", "id": f"t{i}"} for i in range(1, 13)]


class SkillAgent(Agent):
    def __init__(self):
        self.skill = Parameter("", description="the examples this agent can solve")

    def forward(self, x):
        return "yes" if x in self.skill.value.split() else "no"


def optimizer_reply(messages):
    current = json.loads(re.search(r"- current value: (.*)", messages[-1]["content"]).group(1))
    return json.dumps({"reasoning": "next", "suggestion": {"skill": NEXT_SKILL.get(current, current)}})


def aggregator_reply(messages):
    skill = re.findall(r'"skill": (".*")', messages[-1]["content"])[-1]  # the last suggestion
    return json.dumps({"reasoning_skill": "pass it on", "suggestion": {"skill": json.loads(skill)}})


def make_trainer(selection="pareto", budget=None):
    agent = SkillAgent()
    trainer = AggregatedUpdate(
        agent, Optimizer(ScriptedModel(optimizer_reply, name="opt", budget=budget)),
        aggregator=Aggregator(ScriptedModel(aggregator_reply, name="agg")),
        validation=DatasetValidation(VALIDATION), selection=selection, concurrency=1,
        proposals="per_instance", final_check=None)  # the pool's own pick (the final check has tests of its own)
    return trainer, agent


ARGS = {"batch_size": 1, "progress": False, "shuffle": False, "seed": 0}


def rollouts(scores):
    return [Rollout(example_id=f"v{i}", x=i, score=s) for i, s in enumerate(scores, start=1)]


# ------------------------------------------------------------------------- the pool


def test_the_front_keeps_what_is_best_somewhere_and_drops_the_dominated():
    pool = CandidatePool()
    pool.add("start", {}, rollouts([0, 0, 0, 0]), step=0, parent_id=None)
    pool.add("A", {}, rollouts([1, 1, 0, 0]), step=1, parent_id="start")
    pool.add("B", {}, rollouts([0, 0, 1, 0]), step=2, parent_id="A")
    pool.add("C", {}, rollouts([1, 0, 0, 0]), step=3, parent_id="A")  # dominated by A
    # v1, v2: A; v3: B; v4: nobody solves it, so the two front members tie there
    assert pool.front() == {"A": 3, "B": 2}
    assert pool.best().candidate_id == "A"


def test_unscored_examples_count_for_nobody_and_ties_on_the_mean_keep_the_earliest():
    pool = CandidatePool()
    pool.add("A", {}, rollouts([1, None]), step=1, parent_id=None)
    pool.add("B", {}, rollouts([None, None]), step=2, parent_id=None)
    pool.add("C", {}, rollouts([1, None]), step=3, parent_id=None)
    assert pool.front() == {"A": 1, "C": 1}
    assert pool.best().candidate_id == "A"


def test_sampling_follows_the_front_weights():
    pool = CandidatePool()
    pool.add("A", {}, rollouts([1, 1, 0, 0, 0]), step=1, parent_id=None)
    pool.add("B", {}, rollouts([0, 0, 1, 1, 1]), step=2, parent_id=None)
    pool.add("C", {}, rollouts([0, 0, 0, 0, 0]), step=3, parent_id=None)
    rng = np.random.default_rng(0)
    draws = [pool.sample(rng).candidate_id for _ in range(4000)]
    assert set(draws) == {"A", "B"}
    assert draws.count("B") / len(draws) == pytest.approx(0.6, abs=0.03)


# ------------------------------------------------------------------------ training


def test_pareto_keeps_a_candidate_that_solves_what_no_other_does(tmp_path):
    trainer, agent = make_trainer("pareto")
    result = trainer.train(ExactMatchGuide(), TRAIN[:3], run_dir=tmp_path, **ARGS)
    ledger = RunDir(tmp_path).ledger()
    pool = {r["candidate_id"]: r for r in ledger if r["type"] == "pool"}
    skills = {cid: r["values"]["skill"] for cid, r in pool.items()}
    # with seed 0, step 3 starts from "v3" (the lower mean), whose next skill is "v3 v4"
    assert sorted(skills.values()) == ["", "v1 v2", "v3", "v3 v4"]
    by_skill = {v: cid for cid, v in skills.items()}
    parents = [r for r in ledger if r["type"] == "parent"]
    assert [p["step"] for p in parents] == [2, 3]
    # after step 1 only "v1 v2" is on the front; after step 2 "v3" joins it (best on v3)
    assert parents[0]["front"] == {by_skill["v1 v2"]: 4}
    assert parents[1]["front"] == {by_skill["v1 v2"]: 3, by_skill["v3"]: 2}
    assert (result.accepted, result.rejected) == (2, 1)  # "v3 v4" beat its parent "v3"
    # the run ends with the best mean on the validation set ("v1 v2" and "v3 v4" tie: the earlier)
    assert result.final_parameters == {"skill": "v1 v2"} and agent.skill.stored_value == "v1 v2"


def test_pareto_explores_from_the_lower_mean_candidate_and_finds_more(tmp_path):
    trainer, agent = make_trainer("pareto")
    result = trainer.train(ExactMatchGuide(), TRAIN, run_dir=tmp_path, test_dataset=VALIDATION, eval_frequency=1,
                           **ARGS)
    ledger = RunDir(tmp_path).ledger()
    parent_skills = {json.dumps(r["front"], sort_keys=True) for r in ledger if r["type"] == "parent"}
    assert len(parent_skills) > 1
    # "v3" -> "v3 v4" -> "v1 v2 v3": only reachable by starting from "v3" (mean 0.25)
    assert result.final_parameters == {"skill": "v1 v2 v3"}
    # the final test score is measured with the values the run ends with, once per step
    assert result.final_test_score == 0.75
    assert [step for step, _ in result.test_scores] == list(range(len(TRAIN) + 1))
    greedy, _ = make_trainer("greedy")
    assert greedy.train(ExactMatchGuide(), TRAIN, **ARGS).final_parameters == {"skill": "v1 v2"}


def test_pareto_needs_a_validation_dataset():
    for validation in ("minibatch", "none"):
        with pytest.raises(ValueError, match="validation=<a dataset>"):
            AggregatedUpdate(SkillAgent(), Optimizer(ScriptedModel([])), validation=validation, selection="pareto", proposals="per_instance")
    with pytest.raises(ValueError, match="selection must be one of 'greedy', 'pareto', 'epsilon_greedy', 'top_k'"):
        AggregatedUpdate(SkillAgent(), Optimizer(ScriptedModel([])), selection="best", proposals="per_instance", validation="minibatch", final_check=None)


def ledger_shape(run_dir):
    """The ledger's records, less the current values' validation measurements: a resumed
    run measures its current values again (paid, and on the record)."""
    return sorted((r["step"], r["type"], r.get("accepted"), json.dumps(r.get("values") or r.get("update"),
                                                                       sort_keys=True),
                   json.dumps(sorted((r.get("front") or {}).values())))
                  for r in RunDir(run_dir).ledger() if r.get("phase") != "current")


def test_resume_with_a_pool_gives_the_same_run(tmp_path):
    trainer, _ = make_trainer("pareto")
    whole = trainer.train(ExactMatchGuide(), TRAIN, run_dir=tmp_path / "a", **ARGS)

    trainer, _ = make_trainer("pareto", budget=Budget(max_calls=5))
    stopped = trainer.train(ExactMatchGuide(), TRAIN, run_dir=tmp_path / "b", **ARGS)
    assert stopped.stopped_reason and 0 < stopped.steps < whole.steps
    saved = json.loads((tmp_path / "b" / "checkpoint.json").read_text())
    assert len(saved["trainer_state"]["pool"]["entries"]) >= 2

    trainer, agent = make_trainer("pareto")
    result = trainer.train(ExactMatchGuide(), TRAIN, run_dir=tmp_path / "b", resume=True, **ARGS)
    assert result.final_parameters == whole.final_parameters
    assert (result.accepted, result.rejected, result.train_scores) == (whole.accepted, whole.rejected,
                                                                      whole.train_scores)
    assert ledger_shape(tmp_path / "b") == ledger_shape(tmp_path / "a")
