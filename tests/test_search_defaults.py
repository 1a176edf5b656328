"""The default search: a held-out validation split, racing, accepted ties, and the
pool-based selectors (epsilon-greedy, top-k, a user's own)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest

from opto import AggregatedUpdate, ExactMatchGuide, Optimizer, RunDir, RunDirError, ScriptedModel
from opto.search import HoldOut
from opto.search.pool import CandidatePool
from opto.search.registry import make
from opto.search.selection import EpsilonGreedy, TopK
from opto.search.validation import DatasetValidation, MinibatchFirst, ValidationContext
from opto.core.rollout import Rollout
from world import LevelAgent, agent_reply, dataset, make_brain

DATA = dataset(list(range(40)))


def default_trainer(level: int = 4) -> tuple[AggregatedUpdate, LevelAgent, ScriptedModel]:
    agent = LevelAgent(ScriptedModel(agent_reply, name="agent-model"), level=level)
    brain = ScriptedModel(make_brain(delta=3), name="brain")
    return AggregatedUpdate(agent, Optimizer(brain), llm=brain), agent, brain


def test_auto_validation_holds_out_a_quarter_that_training_never_proposes_from(tmp_path):
    trainer, agent, _ = default_trainer()
    result = trainer.train(ExactMatchGuide(), DATA, batch_size=4, seed=2, progress=False, run_dir=tmp_path)
    assert isinstance(trainer.validation, MinibatchFirst)
    assert trainer.validation.race == 8 and trainer.validation.accept_ties
    held = [e.id for e in trainer.validation.examples]
    assert len(held) == 16  # a quarter of 40 is 10: at least min_size=16
    config = json.loads((tmp_path / "checkpoint.json").read_text())["config"]
    assert config["validation_ids"] == held and config["num_examples"] == 24
    trained_on = {r.instance_id for r in RunDir(tmp_path).events("rollout") if r.phase in ("train", "screening")}
    assert trained_on and not trained_on & set(held)
    assert result.accepted >= 1
    # Same seed, same split; another seed, another.
    assert HoldOut().split(_examples(), 2)[1] == trainer.validation.examples
    assert HoldOut().split(_examples(), 3)[1] != trainer.validation.examples


def _examples() -> list[Any]:
    from opto import load_dataset

    return load_dataset(DATA)


def test_resuming_with_other_data_is_refused_before_anything_changes(tmp_path):
    trainer, *_ = default_trainer()
    trainer.train(ExactMatchGuide(), DATA, batch_size=4, seed=2, progress=False, run_dir=tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    other = [{**row, "id": f"y{i}"} for i, row in enumerate(DATA)]
    trainer, *_ = default_trainer()
    with pytest.raises(RunDirError, match="validation_ids"):
        trainer.train(ExactMatchGuide(), other, batch_size=4, seed=2, progress=False, run_dir=tmp_path, resume=True)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.parametrize("batch_size", [4, 2])
def test_too_little_data_to_split_validates_on_the_whole_training_set(batch_size):
    trainer, *_ = default_trainer()
    trainer.train(ExactMatchGuide(), DATA[:31], batch_size=batch_size, progress=False)
    # a candidate that wins on its batch is raced on every training example, ties accepted
    assert isinstance(trainer.validation, MinibatchFirst)
    assert [e.id for e in trainer.validation.examples] == [row["id"] for row in DATA[:31]]
    assert trainer.validation.race == 8 and trainer.validation.accept_ties


def test_pool_selection_with_too_little_data_says_what_to_pass():
    agent = LevelAgent(ScriptedModel(agent_reply, name="agent-model"))
    trainer = AggregatedUpdate(agent, Optimizer(ScriptedModel(make_brain(), name="brain")), selection="pareto")
    with pytest.raises(ValueError, match="too few to hold one out.*validation=<a dataset>"):
        trainer.train(ExactMatchGuide(), DATA[:31], progress=False)


def test_holdout_rules_are_checked():
    for bad in ({"fraction": 0}, {"fraction": 1.5}, {"min_size": 0}, {"min_size": 9, "max_size": 4}):
        with pytest.raises(ValueError, match="HoldOut"):
            HoldOut(**bad)
    assert HoldOut().split(_examples()[:31], 0) is None
    train, held = HoldOut(fraction=0.5, min_size=2).split(_examples(), 0)
    assert len(held) == 20 and len(train) == 20 and not {e.id for e in held} & {e.id for e in train}


# ------------------------------------------------------------------ racing and ties


def decide(validation: DatasetValidation, level_now: int, candidate_level: int) -> Any:
    agent = LevelAgent(ScriptedModel(agent_reply, name="agent-model"), level=level_now)
    ctx = ValidationContext(agent=agent, guide=ExactMatchGuide(), batch=[], current_rollouts=[], min_score=0.0)
    return asyncio.run(validation.decide(ctx, "c1", {agent.system_prompt: f"level {candidate_level}"}))


def test_a_race_drops_a_worse_candidate_early_and_validates_a_better_one_fully():
    validation = DatasetValidation(DATA, race=4)
    worse = decide(validation, 10, 2)
    assert not worse.accepted and worse.stage == "race" and worse.rollouts_saved >= 4
    assert len(worse.rollouts) + worse.rollouts_saved == len(DATA)
    assert "dropped after" in worse.reason
    again = decide(validation, 10, 2)  # the order comes from the update: the same each time
    assert [r.example_id for r in again.rollouts] == [r.example_id for r in worse.rollouts]
    better = decide(validation, 10, 14)
    assert better.accepted and better.stage is None and len(better.rollouts) == len(DATA)


def test_ties_are_accepted_only_when_asked():
    # Levels above 40 answer every example: a tie between level 45 and level 50.
    assert not decide(DatasetValidation(DATA), 45, 50).accepted
    tie = decide(DatasetValidation(DATA, accept_ties=True), 45, 50)
    assert tie.accepted and ">=" in tie.reason


@pytest.mark.parametrize("bad", [{"race": 0}, {"race": True}, {"behind": 0}])
def test_race_settings_are_checked(bad):
    with pytest.raises(ValueError, match="race|behind"):
        DatasetValidation(DATA, **bad)


# ------------------------------------------------------------------ selectors


def pool_of(means: list[float]) -> CandidatePool:
    pool = CandidatePool()
    for i, mean in enumerate(means):
        scores = [Rollout(x=j, output="", score=1.0 if j < mean * 10 else 0.0, example_id=f"e{j}") for j in range(10)]
        pool.add(f"c{i}", {"p": i}, scores, step=i, parent_id=None)
    return pool


def test_epsilon_greedy_and_top_k_draw_from_the_right_members():
    pool = pool_of([0.2, 0.9, 0.5, 0.7])
    rng = np.random.default_rng(0)
    assert {EpsilonGreedy(0.0).parent(pool, rng).candidate_id for _ in range(20)} == {"c1"}
    assert {EpsilonGreedy(1.0).parent(pool, rng).candidate_id for _ in range(60)} == {"c0", "c1", "c2", "c3"}
    assert {TopK(2).parent(pool, rng).candidate_id for _ in range(60)} == {"c1", "c3"}
    with pytest.raises(ValueError, match="epsilon"):
        EpsilonGreedy(1.5)
    with pytest.raises(ValueError, match="k must be"):
        TopK(0)


def test_a_selector_a_user_writes_drives_the_run(tmp_path):
    class Newest:  # the README's example: always continue from the latest validated candidate
        name = "newest"
        uses_pool = True

        def parent(self, pool, rng):
            return pool.entries[-1]

    agent = LevelAgent(ScriptedModel(agent_reply, name="agent-model"), level=2)
    brain = ScriptedModel(make_brain(delta=2), name="brain")
    trainer = AggregatedUpdate(agent, Optimizer(brain), llm=brain, selection=Newest(), validation=DATA[:8])
    trainer.train(ExactMatchGuide(), DATA[8:], batch_size=4, num_epochs=2, progress=False, run_dir=tmp_path)
    parents = [e.candidate_id for e in RunDir(tmp_path).events("parent")]
    pool_ids = [e.candidate_id for e in RunDir(tmp_path).events("pool")]
    assert parents and all(p in pool_ids for p in parents)
    assert make("selection", Newest()).name == "newest"


@pytest.mark.parametrize("options", [
    {"selection": "epsilon_greedy"},
    {"selection": "top_k"},
    {"validation": lambda: MinibatchFirst(DATA[:16], race=4, accept_ties=True)},
], ids=["epsilon-greedy", "top-k", "race-and-ties"])
def test_a_stopped_run_of_each_strategy_resumes_to_the_same_ledger(options, tmp_path):
    from opto import MaxCalls
    from world import ledger_of, search_records

    def run(run_dir, **kwargs):
        agent = LevelAgent(ScriptedModel(agent_reply, name="agent-model"), level=2)
        brain = ScriptedModel(make_brain(delta=3), name="brain")
        made = {k: v() if callable(v) else v for k, v in options.items()}  # a fresh validation object a run
        trainer = AggregatedUpdate(agent, Optimizer(brain), llm=brain, **{"validation": DATA[:16], **made})
        return trainer.train(ExactMatchGuide(), DATA[:16], batch_size=4, num_epochs=2, seed=5, progress=False,
                             run_dir=run_dir, min_score=0.0, **kwargs)

    whole = run(tmp_path / "whole")
    assert whole.accepted >= 2
    stopped = run(tmp_path / "parts", stop=MaxCalls(70))
    assert stopped.stopped_reason and stopped.steps < whole.steps
    resumed = run(tmp_path / "parts", resume=True)
    assert resumed.final_parameters == whole.final_parameters
    assert search_records(ledger_of(tmp_path / "parts")) == search_records(ledger_of(tmp_path / "whole"))


def test_a_validation_object_reused_by_another_run_measures_the_current_values_again():
    validation = DatasetValidation(DATA[:8])
    # The same values in both runs; the first run's agent model gets everything wrong.
    for reply, expected in ((lambda messages: "wrong", {0.0}), (agent_reply, {1.0})):
        agent = LevelAgent(ScriptedModel(reply, name="agent-model"), level=10)
        brain = ScriptedModel(make_brain(delta=1), name="brain")
        trainer = AggregatedUpdate(agent, Optimizer(brain), llm=brain, validation=validation)
        trainer.train(ExactMatchGuide(), DATA[30:34], batch_size=4, progress=False, min_score=0.0)
        start = [f for key, f in validation._current.items() if '"level 10"' in key]
        assert start and {r.score for r in start[0].result()} == expected
