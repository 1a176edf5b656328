"""The training loop end to end with scripted models: decisions, failures, run dirs, resume.

The world: an agent whose model answers `2x` for input `x` only when its system prompt
says "level N" with `x < N`; an exact-match guide; and one scripted "brain" model that
plays the optimizer and the aggregator, telling which by the system message. The brain
raises the level by `delta`, so whether a candidate helps depends on the batch.
"""

import asyncio
import collections
import json
import signal

import pytest

from opto import (
    Agent,
    AggregatedUpdate,
    Aggregator,
    Budget,
    ExactMatchGuide,
    Feedback,
    Guide,
    Optimizer,
    Parameter,
    ResponseCache,
    RunDir,
    TooManyFailures,
    evaluate,
)
from opto.llm import LLMError, ScriptedModel
from opto import DatasetValidation
from opto.trainer import InstanceOutput, StepOutcome
from world import AGGREGATOR_SYSTEM, LevelAgent, agent_reply, dataset, make_brain, requests_of
from world import make_level_trainer as make_trainer

TRAIN = {"progress": False, "shuffle": False}


# ------------------------------------------------------------------ accept / reject


def test_an_improving_candidate_is_accepted_and_applied(tmp_path):
    trainer, the_agent, agent_model, brain = make_trainer()
    result = trainer.train(ExactMatchGuide(), dataset([0]), **TRAIN)
    assert result.accepted == 1 and result.rejected == 0 and result.steps == 1
    assert the_agent.system_prompt.stored_value == "level 1"
    assert result.final_parameters == {"system_prompt": "level 1"}
    assert result.train_scores == [0.0]  # the batch score under the values before the step
    assert result.stopped_reason is None
    assert len(requests_of(brain, "optimizer")) == 1 and len(requests_of(brain, "aggregator")) == 1


def test_a_tied_candidate_is_rejected_and_nothing_changes():
    trainer, the_agent, agent_model, brain = make_trainer()
    result = trainer.train(ExactMatchGuide(), dataset([3]), **TRAIN)  # level 1 is still wrong on 3: a tie
    assert result.accepted == 0 and result.rejected == 1
    assert the_agent.system_prompt.stored_value == "level 0"
    assert result.final_parameters == {"system_prompt": "level 0"}


def test_a_worse_candidate_is_rejected_and_rolled_back():
    trainer, the_agent, agent_model, brain = make_trainer(level=2, delta=-2)
    result = trainer.train(ExactMatchGuide(), dataset([0, 1]), batch_size=2, **TRAIN)
    assert result.rejected == 1 and result.accepted == 0
    assert the_agent.system_prompt.stored_value == "level 2"
    assert result.train_scores == [1.0]


def test_minibatch_validation_reuses_the_current_scores():
    trainer, the_agent, agent_model, brain = make_trainer()
    trainer.train(ExactMatchGuide(), dataset([0, 5]), batch_size=2, **TRAIN)
    # 2 batch runs + 2 runs of the one candidate; the current values are not run again
    assert len(agent_model.requests) == 4
    systems = collections.Counter(r["messages"][0]["content"] for r in agent_model.requests)
    assert systems == {"level 0": 2, "level 1": 2}


def test_validation_none_accepts_even_a_worse_candidate():
    trainer, the_agent, agent_model, brain = make_trainer(level=2, delta=-2, validation="none")
    result = trainer.train(ExactMatchGuide(), dataset([0, 1]), batch_size=2, **TRAIN)
    assert result.accepted == 1
    assert the_agent.system_prompt.stored_value == "level 0"
    assert len(agent_model.requests) == 2  # no validation runs


def test_dataset_validation_decides_on_the_validation_set():
    # On the training batch (x=5) level 1 ties; on the validation set (x=0) it is better.
    validation = dataset([0, 7])
    trainer, the_agent, agent_model, brain = make_trainer(validation=DatasetValidation(validation))
    result = trainer.train(ExactMatchGuide(), dataset([5]), **TRAIN)
    assert result.accepted == 1
    assert the_agent.system_prompt.stored_value == "level 1"
    inputs = collections.Counter((r["messages"][0]["content"], r["messages"][1]["content"])
                                 for r in agent_model.requests)
    assert inputs == {("level 0", "5"): 1, ("level 0", "0"): 1, ("level 0", "7"): 1,
                      ("level 1", "0"): 1, ("level 1", "7"): 1}


def test_dataset_validation_rejects_what_does_not_help_there():
    trainer, the_agent, agent_model, brain = make_trainer(validation=DatasetValidation(dataset([6, 7])))
    result = trainer.train(ExactMatchGuide(), dataset([0]), **TRAIN)  # better on the batch, a tie on validation
    assert result.rejected == 1 and the_agent.system_prompt.stored_value == "level 0"


@pytest.mark.parametrize("threshold, accepted", [(0.0, 1), (0.49, 1), (0.5, 0), (0.6, 0)])
def test_improvement_threshold(threshold, accepted):
    trainer, the_agent, *_ = make_trainer(improvement_threshold=threshold)
    result = trainer.train(ExactMatchGuide(), dataset([0, 5]), batch_size=2, **TRAIN)  # +0.5 with level 1
    assert result.accepted == accepted
    assert the_agent.system_prompt.stored_value == ("level 1" if accepted else "level 0")


def test_with_several_candidates_the_best_accepted_one_is_applied(tmp_path):
    samples = iter(["level 0", "level 3", "level 1"])

    def two_samples(messages):
        return json.dumps({"suggestion": {"system_prompt": next(samples)}})

    agent_model = ScriptedModel(agent_reply)
    brain = ScriptedModel(make_brain(aggregator=two_samples))
    the_agent = LevelAgent(agent_model, level=2)
    trainer = AggregatedUpdate(the_agent, Optimizer(brain), aggregator=Aggregator(brain, num_candidates=2), proposals="per_instance", validation="minibatch", final_check=None)
    result = trainer.train(ExactMatchGuide(), dataset([0, 1, 2]), batch_size=3, run_dir=tmp_path, **TRAIN)
    assert result.accepted == 1
    assert the_agent.system_prompt.stored_value == "level 3"
    [aggregation] = requests_of(brain, "aggregator")
    assert aggregation["n"] == 2
    decisions = [r for r in RunDir(tmp_path).ledger() if r["type"] == "decision"]
    assert [(d["accepted"], d["candidate_score"]) for d in decisions] == [(False, 0.0), (True, 1.0)]
    [applied] = [r for r in RunDir(tmp_path).ledger() if r["type"] == "applied"]
    assert applied["candidate_id"] == decisions[1]["candidate_id"]


# ----------------------------------------------------------------------- failures


def test_an_agent_failure_gets_min_score_and_no_proposal_and_the_run_goes_on(tmp_path):
    trainer, the_agent, agent_model, brain = make_trainer(agent_kwargs={"fail_on": {9}})
    result = trainer.train(ExactMatchGuide(), dataset([9, 0]), batch_size=2, min_score=-1.0,
                           run_dir=tmp_path / "run", **TRAIN)
    assert result.steps == 1 and result.stopped_reason is None
    assert result.train_scores == [-0.5]  # (-1 + 0) / 2
    optimizer_requests = requests_of(brain, "optimizer")
    assert len(optimizer_requests) == 1
    assert "# Input\n0" in optimizer_requests[0]["messages"][-1]["content"]
    ledger = RunDir(tmp_path / "run").ledger()
    failed = [r for r in ledger if r["type"] == "rollout" and r["instance_id"] == "x9" and r["phase"] == "train"]
    [failed] = failed
    assert failed["score"] == -1.0
    assert "RuntimeError: agent cannot handle 9" in failed["error"]
    assert "agent cannot handle 9" in failed["feedback"]
    assert all(r["instance_id"] == "x0" for r in ledger if r["type"] == "proposal")
    assert result.accepted == 1  # level 1: x=0 right, x=9 still fails with min_score both times


def test_a_guide_failure_is_handled_like_an_agent_failure(tmp_path):
    class PickyGuide(Guide):
        async def get_feedback(self, x, output, info):
            if x == 4:
                raise ValueError("cannot judge 4")
            return Feedback(score=float(output == info), feedback="ok")

    trainer, the_agent, agent_model, brain = make_trainer()
    result = trainer.train(PickyGuide(), dataset([4, 0]), batch_size=2, min_score=0.0, run_dir=tmp_path,
                           **TRAIN)
    assert result.train_scores == [0.0] and result.stopped_reason is None
    [request] = requests_of(brain, "optimizer")
    assert "# Input\n0" in request["messages"][-1]["content"]
    assert result.accepted == 1
    [failed] = [r for r in RunDir(tmp_path).ledger()
                if r["type"] == "rollout" and r["phase"] == "train" and r["instance_id"] == "x4"]
    assert failed["score"] == 0.0 and failed["output"] == "wrong"
    assert failed["error"] == "guide: ValueError: cannot judge 4"
    assert "cannot judge 4" in failed["feedback"]


def test_a_garbage_optimizer_reply_gives_no_update_and_the_run_goes_on():
    trainer, the_agent, agent_model, brain = make_trainer(
        brain_kwargs={"optimizer": lambda messages: "no idea, sorry"})
    result = trainer.train(ExactMatchGuide(), dataset([0, 1, 2]), **TRAIN)
    assert result.steps == 3 and result.no_update == 3 and result.accepted == result.rejected == 0
    assert requests_of(brain, "aggregator") == []
    assert the_agent.system_prompt.stored_value == "level 0"


def test_an_aggregator_reply_garbage_twice_gives_no_update_and_the_run_goes_on(tmp_path):
    trainer, the_agent, agent_model, brain = make_trainer(
        brain_kwargs={"aggregator": lambda messages: "hmm, hard to say"})
    result = trainer.train(ExactMatchGuide(), dataset([0, 1]), run_dir=tmp_path / "run", **TRAIN)
    assert result.steps == 2 and result.no_update == 2
    assert len(requests_of(brain, "aggregator")) == 4  # one repair request per step
    assert the_agent.system_prompt.stored_value == "level 0"
    decisions = [r for r in RunDir(tmp_path / "run").ledger() if r["type"] == "decision"]
    assert len(decisions) == 2 and all(d["accepted"] is None for d in decisions)
    assert all("no suggestion could be extracted" in d["reason"] for d in decisions)


def test_an_optimizer_llm_error_on_one_instance_leaves_the_others(tmp_path):
    normal = make_brain()

    def flaky(messages):
        if "# Input\n1\n" in messages[-1]["content"]:
            raise LLMError("rate limited for good")
        return normal(messages)

    trainer, the_agent, agent_model, brain = make_trainer(brain_kwargs={"optimizer": flaky})
    result = trainer.train(ExactMatchGuide(), dataset([1, 0, 2]), batch_size=3, run_dir=tmp_path / "run",
                           **TRAIN)
    assert result.steps == 1 and result.accepted == 1
    ledger = RunDir(tmp_path / "run").ledger()
    assert sorted(r["instance_id"] for r in ledger if r["type"] == "proposal") == ["x0", "x2"]
    [error] = [r for r in ledger if r["type"] == "proposal_error"]
    assert error["instance_id"] == "x1" and "rate limited" in error["error"]


def test_an_aggregator_llm_error_gives_no_update():
    def broken(messages):
        raise LLMError("aggregator down")

    trainer, the_agent, *_ = make_trainer(brain_kwargs={"aggregator": broken})
    result = trainer.train(ExactMatchGuide(), dataset([0]), **TRAIN)
    assert result.no_update == 1 and the_agent.system_prompt.stored_value == "level 0"


# ----------------------------------------------------------------------- the API


def test_unknown_keyword_is_a_type_error_naming_it():
    trainer, *_ = make_trainer()
    with pytest.raises(TypeError, match="num_epoch"):
        trainer.train(ExactMatchGuide(), dataset([0]), num_epoch=2)


def test_bad_arguments_are_rejected():
    trainer, *_ = make_trainer()
    with pytest.raises(ValueError, match="stepsize"):
        trainer.train(ExactMatchGuide(), dataset([0]), stepsize=2.0, progress=False)
    with pytest.raises(TypeError, match="Guide"):
        trainer.train(lambda x, o, i: 1.0, dataset([0]), progress=False)
    with pytest.raises(TypeError, match="Agent"):
        AggregatedUpdate(object(), Optimizer(ScriptedModel([])), proposals="per_instance", validation="minibatch", final_check=None)


async def test_sync_train_works_inside_a_running_event_loop():
    trainer, the_agent, *_ = make_trainer()
    result = trainer.train(ExactMatchGuide(), dataset([0]), **TRAIN)
    assert result.accepted == 1 and the_agent.system_prompt.stored_value == "level 1"


async def test_atrain_is_the_async_twin():
    trainer, the_agent, *_ = make_trainer()
    result = await trainer.atrain(ExactMatchGuide(), dataset([0, 1]), num_epochs=1, **TRAIN)
    assert result.accepted == 2 and the_agent.system_prompt.stored_value == "level 2"


def test_test_dataset_is_evaluated_at_the_start_and_after_steps():
    trainer, *_ = make_trainer()
    result = trainer.train(ExactMatchGuide(), dataset([0, 1]), test_dataset=dataset([0, 1, 2, 3]),
                           eval_frequency=1, **TRAIN)
    assert result.test_scores == [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert result.initial_test_score == 0.0 and result.final_test_score == 0.5


def test_usage_counts_every_model_once(tmp_path):
    trainer, the_agent, agent_model, brain = make_trainer(agent_model_kwargs={"cache": ResponseCache(tmp_path / "c")})
    result = trainer.train(ExactMatchGuide(), dataset([0, 5, 6]), batch_size=3, num_epochs=2,
                           run_dir=tmp_path / "run", **TRAIN)
    assert result.usage_by_model["agent-model"].calls == agent_model.usage.calls
    assert result.usage_by_model["agent-model"].cached_calls == agent_model.usage.cached_calls > 0
    assert result.usage_by_model["brain"].calls == brain.usage.calls
    assert result.usage.calls == agent_model.usage.calls + brain.usage.calls
    last = RunDir(tmp_path / "run").metrics()[-1]
    assert last["calls"] == result.usage.calls and last["cached_calls"] == result.usage.cached_calls


def test_verbose_prints_the_prompts_and_replies(capsys):
    trainer, *_ = make_trainer()
    trainer.train(ExactMatchGuide(), dataset([0]), verbose=True, **TRAIN)
    out = capsys.readouterr().out
    assert "----- optimizer prompt -----" in out and "----- aggregator reply -----" in out
    assert "level 1" in out


def test_quiet_by_default(capsys):
    trainer, *_ = make_trainer()
    trainer.train(ExactMatchGuide(), dataset([0]), **TRAIN)
    assert capsys.readouterr().out == ""


# ------------------------------------------------------------------------- run dir


def test_run_dir_ledger_links_every_record(tmp_path):
    run_dir = tmp_path / "run"
    trainer, the_agent, *_ = make_trainer()
    result = trainer.train(ExactMatchGuide(), dataset([0, 1, 5, 6]), batch_size=2, num_epochs=1,
                           run_dir=run_dir, **TRAIN)
    assert result.run_dir == str(run_dir)
    run = RunDir(run_dir)
    assert run.checkpoint_path.is_file() and run.metrics_path.is_file() and run.ledger_path.is_file()
    ledger = run.ledger()
    kinds = collections.Counter(r["type"] for r in ledger)
    assert {"rollout", "proposal", "candidate", "decision"} <= set(kinds)

    for step in (1, 2):
        records = [r for r in ledger if r["step"] == step]
        train_rollouts = [r for r in records if r["type"] == "rollout" and r["phase"] == "train"]
        instance_ids = {r["instance_id"] for r in train_rollouts}
        assert len(instance_ids) == 2
        proposals = [r for r in records if r["type"] == "proposal"]
        assert proposals and {p["instance_id"] for p in proposals} <= instance_ids
        proposal_ids = {p["proposal_id"] for p in proposals}
        candidates = [r for r in records if r["type"] == "candidate" and r["final"]]
        assert len(candidates) == 1
        [candidate] = candidates
        assert candidate["source_proposals"] and set(candidate["source_proposals"]) <= proposal_ids
        [decision] = [r for r in records if r["type"] == "decision"]
        assert decision["candidate_id"] == candidate["candidate_id"]
        validation = [r for r in records if r["type"] == "rollout" and r["phase"] == "validation"]
        assert {r["candidate_id"] for r in validation} == {candidate["candidate_id"]}
        assert {r["instance_id"] for r in validation} == instance_ids

    decisions = [r for r in ledger if r["type"] == "decision"]
    assert [d["accepted"] for d in decisions] == [True, False]  # x0,x1 then x5,x6 with level 1 vs 2: a tie
    [applied] = [r for r in ledger if r["type"] == "applied"]
    assert applied["step"] == 1 and applied["candidate_id"] == decisions[0]["candidate_id"]

    checkpoint = json.loads(run.checkpoint_path.read_text())
    assert checkpoint["step"] == 2 and checkpoint["finished"] is True
    assert checkpoint["parameters"] == {"system_prompt": "level 1"}
    metrics = run.metrics()
    assert [m["step"] for m in metrics] == [1, 2]
    assert [m["accepted"] for m in metrics] == [True, False]
    assert all("sk-" not in line for line in run.ledger_path.read_text().splitlines())


def test_an_existing_run_dir_needs_resume(tmp_path):
    trainer, *_ = make_trainer()
    trainer.train(ExactMatchGuide(), dataset([0]), run_dir=tmp_path, **TRAIN)
    trainer2, *_ = make_trainer()
    with pytest.raises(ValueError, match="resume=True"):
        trainer2.train(ExactMatchGuide(), dataset([0]), run_dir=tmp_path, **TRAIN)


def test_resume_needs_a_run_dir_and_the_same_settings(tmp_path):
    trainer, *_ = make_trainer()
    with pytest.raises(ValueError, match="run_dir"):
        trainer.train(ExactMatchGuide(), dataset([0]), resume=True, **TRAIN)
    trainer.train(ExactMatchGuide(), dataset([0, 1]), run_dir=tmp_path, **TRAIN)
    again, *_ = make_trainer()
    with pytest.raises(ValueError, match="batch_size"):
        again.train(ExactMatchGuide(), dataset([0, 1]), run_dir=tmp_path, resume=True, batch_size=2, **TRAIN)


# -------------------------------------------------------------------------- resume

RESUME_DATA = dataset([0, 1, 2, 3, 4, 5])
RESUME_ARGS = {"num_epochs": 2, "batch_size": 2, "seed": 3, "progress": False, "min_score": 0.0,
               "test_dataset": dataset([0, 1, 2, 3, 4, 5]), "eval_frequency": 3}


class CountingGuide(ExactMatchGuide):
    """Presses Ctrl-C (a real SIGINT) at its `interrupt_at`-th call (1-based)."""

    def __init__(self, interrupt_at=None):
        super().__init__()
        self.calls = 0
        self.interrupt_at = interrupt_at

    async def aget_feedback(self, x, output, info):
        self.calls += 1
        if self.calls == self.interrupt_at:
            signal.raise_signal(signal.SIGINT)  # asyncio.run cancels the run, then raises KeyboardInterrupt
            await asyncio.sleep(0)
        return await super().aget_feedback(x, output, info)


def resume_trainer(cache=None, budget=None):
    """Agent, optimizer and aggregator each on its own model (with `budget` on the optimizer's)."""
    kwargs = {"cache": cache} if cache is not None else {}
    agent_model = ScriptedModel(agent_reply, name="agent-model", **kwargs)
    opt_model = ScriptedModel(make_brain(), name="optimizer-model", budget=budget, **kwargs)
    agg_model = ScriptedModel(make_brain(), name="aggregator-model", **kwargs)
    the_agent = LevelAgent(agent_model)
    trainer = AggregatedUpdate(the_agent, Optimizer(opt_model),
                               aggregator=Aggregator(agg_model), concurrency=1, proposals="per_instance", validation="minibatch", final_check=None)
    return trainer, the_agent, (agent_model, opt_model, agg_model)


def ledger_shape(run_dir):
    """What the ledger says happened, without ids and times."""
    shape = []
    for r in RunDir(run_dir).ledger():
        shape.append((r["step"], r["type"], r.get("instance_id"), r.get("phase"), r.get("accepted"),
                      json.dumps(r.get("update"), sort_keys=True)))
    return sorted(shape)


def run_uninterrupted(tmp_path):
    cache = ResponseCache(tmp_path / "a-cache.sqlite")
    trainer, the_agent, models = resume_trainer(cache)
    result = trainer.train(CountingGuide(), RESUME_DATA, run_dir=tmp_path / "a", **RESUME_ARGS)
    assert result.steps == 6 and result.stopped_reason is None
    assert result.accepted > 0 and result.rejected > 0  # the run is not trivial
    return result, models


def check_resumed(tmp_path, reference, run_dir, first_models, result, second_models):
    ref_result, ref_models = reference
    assert result.final_parameters == ref_result.final_parameters
    assert result.train_scores == ref_result.train_scores
    assert result.test_scores == ref_result.test_scores
    assert (result.accepted, result.rejected, result.no_update) == (
        ref_result.accepted, ref_result.rejected, ref_result.no_update)
    assert result.steps == 6 and result.stopped_reason is None
    assert ledger_shape(run_dir) == ledger_shape(tmp_path / "a")
    assert [m["step"] for m in RunDir(run_dir).metrics()] == [1, 2, 3, 4, 5, 6]
    for first, second, ref in zip(first_models, second_models, ref_models):
        # Paid work is never paid twice: the resumed run's paid requests are new ones...
        first_keys = {json.dumps(r, sort_keys=True, default=str) for r in first.requests}
        second_keys = {json.dumps(r, sort_keys=True, default=str) for r in second.requests}
        assert not first_keys & second_keys, first.name
        # ...and together they are exactly what the uninterrupted run paid for.
        assert first.usage.calls + second.usage.calls == ref.usage.calls, first.name
    assert sum(m.usage.cached_calls for m in second_models) > 0  # the redone part came from the cache


def test_resume_after_an_interrupt_gives_the_same_run(tmp_path):
    reference = run_uninterrupted(tmp_path)
    run_dir = tmp_path / "b"
    cache = ResponseCache(tmp_path / "b-cache.sqlite")

    trainer, the_agent, models = resume_trainer(cache)
    # guide calls: 6 (first test) + 3 steps x (2 batch + 2 validation) + 6 (test after step 3),
    # then 2 for step 4's batch: break in at the first call of step 4's validation
    with pytest.raises(KeyboardInterrupt):
        trainer.train(CountingGuide(interrupt_at=27), RESUME_DATA, run_dir=run_dir, **RESUME_ARGS)
    saved = json.loads((run_dir / "checkpoint.json").read_text())
    assert saved["step"] == 3 and saved["finished"] is False
    aggregations = models[2].usage
    assert aggregations.calls + aggregations.cached_calls == 4  # the 4th step's aggregation was done

    trainer2, agent2, models2 = resume_trainer(cache)
    result = trainer2.train(CountingGuide(), RESUME_DATA, run_dir=run_dir, resume=True, **RESUME_ARGS)
    check_resumed(tmp_path, reference, run_dir, models, result, models2)
    assert agent2.system_prompt.stored_value == reference[0].final_parameters["system_prompt"]


def test_resume_after_a_budget_stop_gives_the_same_run(tmp_path):
    reference = run_uninterrupted(tmp_path)
    ref_optimizer = reference[1][1]
    run_dir = tmp_path / "b"
    cache = ResponseCache(tmp_path / "b-cache.sqlite")

    # stop part-way through the optimizer's calls: mid-step, after some of its work was paid for
    budget = Budget(max_calls=ref_optimizer.usage.calls // 2 + 1)
    trainer, the_agent, models = resume_trainer(cache, budget)
    stopped = trainer.train(CountingGuide(), RESUME_DATA, run_dir=run_dir, **RESUME_ARGS)
    assert stopped.stopped_reason and "budget" in stopped.stopped_reason
    assert 0 < stopped.steps < 6
    assert json.loads((run_dir / "checkpoint.json").read_text())["step"] == stopped.steps

    trainer2, agent2, models2 = resume_trainer(cache)
    result = trainer2.train(CountingGuide(), RESUME_DATA, run_dir=run_dir, resume=True, **RESUME_ARGS)
    check_resumed(tmp_path, reference, run_dir, models, result, models2)


def test_resuming_with_more_epochs_continues_the_run(tmp_path):
    trainer, _, _ = resume_trainer()
    whole = trainer.train(CountingGuide(), RESUME_DATA, run_dir=tmp_path / "whole", **RESUME_ARGS)

    one_epoch = {**RESUME_ARGS, "num_epochs": 1}
    trainer, _, _ = resume_trainer()
    first = trainer.train(CountingGuide(), RESUME_DATA, run_dir=tmp_path / "parts", **one_epoch)
    assert first.steps == 3
    trainer, the_agent, _ = resume_trainer()
    result = trainer.train(CountingGuide(), RESUME_DATA, run_dir=tmp_path / "parts", resume=True, **RESUME_ARGS)
    assert result.steps == 6
    assert result.train_scores == whole.train_scores
    assert result.final_parameters == whole.final_parameters
    assert (result.accepted, result.rejected) == (whole.accepted, whole.rejected)
    assert result.test_scores == whole.test_scores == [(0, 0.0), (3, first.test_scores[-1][1]),
                                                       (6, whole.final_test_score)]


def test_resuming_a_finished_run_does_nothing_more(tmp_path):
    trainer, the_agent, agent_model, brain = make_trainer()
    first = trainer.train(ExactMatchGuide(), dataset([0, 1]), run_dir=tmp_path, **TRAIN)
    trainer2, agent2, agent_model2, brain2 = make_trainer()
    again = trainer2.train(ExactMatchGuide(), dataset([0, 1]), run_dir=tmp_path, resume=True, **TRAIN)
    assert agent_model2.requests == [] and brain2.requests == []
    assert again.final_parameters == first.final_parameters
    assert again.train_scores == first.train_scores and again.steps == 2


# ------------------------------------------------------------------------- budget


def test_budget_exceeded_stops_training_cleanly(tmp_path):
    budget = Budget(max_calls=3)  # step 1: optimizer + aggregator; step 2: optimizer, then refused
    trainer, the_agent, agent_model, brain = make_trainer(brain_model_kwargs={"budget": budget})
    result = trainer.train(ExactMatchGuide(), dataset([0, 1, 2, 3]), run_dir=tmp_path, **TRAIN)
    assert result.stopped_reason is not None and "budget" in result.stopped_reason
    assert result.steps == 1 and result.accepted == 1
    assert the_agent.system_prompt.stored_value == "level 1"
    checkpoint = json.loads((tmp_path / "checkpoint.json").read_text())
    assert checkpoint["step"] == 1 and checkpoint["finished"] is False
    assert checkpoint["parameters"] == {"system_prompt": "level 1"}
    assert brain.usage.calls == 3


# ----------------------------------------------------------------------- evaluate


def test_evaluate_masks_unjudged_scores_and_counts_failures():
    class HalfBlindGuide(Guide):
        def get_feedback(self, x, output, info):
            if x == 2:
                return Feedback(score=None, feedback="could not judge")
            return Feedback(score=float(output == info))

    the_agent = LevelAgent(ScriptedModel(agent_reply), level=1, fail_on={3})
    result = evaluate(the_agent, HalfBlindGuide(), dataset([0, 1, 2, 3]), min_score=None)  # failures left out
    assert result.n == 4 and result.n_failed == 1
    assert result.scores == [1.0, 0.0, None, None]
    assert result.mean == 0.5 and result.std == 0.5
    assert result.outputs[:3] == ["0", "wrong", "wrong"]


def test_a_crashed_example_counts_as_zero_by_default():
    the_agent = LevelAgent(ScriptedModel(agent_reply), level=5, fail_on={3})
    result = evaluate(the_agent, ExactMatchGuide(), dataset([0, 1, 2, 3, 4]))
    assert result.n_failed == 1 and result.scores[3] == 0.0
    assert result.mean == pytest.approx(0.8)  # not 1.0: the crash is not hidden


def test_evaluate_with_values_and_min_score():
    the_agent = LevelAgent(ScriptedModel(agent_reply), level=0, fail_on={3})
    result = evaluate(the_agent, ExactMatchGuide(), dataset([0, 1, 3]), min_score=0.0,
                      values={the_agent.system_prompt: "level 5"})
    assert result.scores == [1.0, 1.0, 0.0] and result.n_failed == 1
    assert result.mean == pytest.approx(2 / 3)
    assert the_agent.system_prompt.value == "level 0"


def test_evaluate_when_nothing_could_be_judged():
    class Blind(Guide):
        def get_feedback(self, x, output, info):
            return Feedback(score=None)

    result = evaluate(LevelAgent(ScriptedModel(agent_reply)), Blind(), dataset([0, 1]))
    assert result.mean is None and result.std is None and result.n == 2


# ------------------------------------------------------------ Trace-compatible names


def test_forward_update_to_param_dict_and_the_aggregator_prompt():
    trainer, the_agent, agent_model, brain = make_trainer()
    assert isinstance(trainer.aggregator_system_prompt, str)
    assert trainer.aggregator_system_prompt.startswith(AGGREGATOR_SYSTEM)
    assert trainer.to_param_dict({"system_prompt": "level 3"}) == {the_agent.system_prompt: "level 3"}
    with pytest.raises(KeyError):
        trainer.to_param_dict({"nope": 1})

    guide = ExactMatchGuide()
    outputs = [trainer.forward(the_agent, x, guide, str(2 * x)) for x in (0, 4)]
    assert all(isinstance(o, InstanceOutput) for o in outputs)
    assert [o.rollout.score for o in outputs] == [0.0, 0.0]
    assert [o.rollout.output for o in outputs] == ["wrong", "wrong"]
    assert outputs[0].rollout.trace and outputs[0].rollout.trace[0]["response"] == "wrong"
    assert [o.proposals[0].update for o in outputs] == [{"system_prompt": "level 1"}] * 2
    assert the_agent.system_prompt.stored_value == "level 0"  # forward never applies

    outcome = trainer.update(outputs)
    assert isinstance(outcome, StepOutcome)
    assert outcome.accepted is True and outcome.update == {"system_prompt": "level 1"}
    assert outcome.score == 0.0 and outcome.candidate_score == 0.5
    assert the_agent.system_prompt.stored_value == "level 1"


async def test_aforward_after_train_works_in_another_event_loop():
    # train() runs its own loop (here in a worker thread); the optimizer gate it used must not
    # leak into the caller's loop, where concurrent aforward calls would then fail.
    brain_reply = make_brain()

    async def slow_brain(messages):
        await asyncio.sleep(0.001)  # so that concurrent proposals really wait at the gate
        return brain_reply(messages)

    the_agent = LevelAgent(ScriptedModel(agent_reply))
    optimizer_model = ScriptedModel(slow_brain)
    trainer = AggregatedUpdate(the_agent, Optimizer(optimizer_model), concurrency=1, proposals="per_instance", validation="minibatch", final_check=None)
    result = await asyncio.to_thread(trainer.train, ExactMatchGuide(), dataset([5, 6, 7, 8]), batch_size=4,
                                     **TRAIN)
    assert result.steps == 1
    guide = ExactMatchGuide()
    outputs = await asyncio.gather(*(trainer.aforward(the_agent, x, guide, str(2 * x)) for x in range(4)))
    assert [o.error for o in outputs] == [None] * 4
    assert all(o.proposals for o in outputs)


def test_update_before_forward_is_an_error():
    trainer, *_ = make_trainer()
    with pytest.raises(ValueError, match="forward"):
        trainer.update([])


def test_aggregator_object_and_llm_arguments():
    brain = ScriptedModel(make_brain())
    other = ScriptedModel(make_brain(), name="other")
    the_agent = LevelAgent(ScriptedModel(agent_reply))
    custom = Aggregator(other, fan_in=3)
    assert AggregatedUpdate(the_agent, Optimizer(brain), aggregator=custom, proposals="per_instance", validation="minibatch", final_check=None).aggregator is custom
    assert AggregatedUpdate(the_agent, Optimizer(brain), llm=other, proposals="per_instance", validation="minibatch", final_check=None).aggregator.model is other
    assert AggregatedUpdate(the_agent, Optimizer(brain), proposals="per_instance", validation="minibatch", final_check=None).aggregator.model is brain


def test_an_agent_without_trainable_parameters_is_refused():
    class Frozen(Agent):
        def __init__(self):
            self.p = Parameter("x", trainable=False)

        def forward(self, x):
            return x

    with pytest.raises(ValueError, match="no trainable Parameter"):
        AggregatedUpdate(Frozen(), Optimizer(ScriptedModel([])), proposals="per_instance", validation="minibatch", final_check=None)


# ------------------------------------------------------- interruptions and torn files


@pytest.mark.parametrize("interrupt_at", [21, 39], ids=["eval-after-step-3", "eval-after-the-last-step"])
def test_resume_after_a_stop_in_the_evaluation_after_a_step(tmp_path, interrupt_at):
    reference = run_uninterrupted(tmp_path)
    run_dir = tmp_path / "b"
    cache = ResponseCache(tmp_path / "b-cache.sqlite")
    trainer, the_agent, models = resume_trainer(cache)
    # guide calls: 6 (first test) + 3 steps x 4, then the test after step 3 (calls 19-24);
    # then 3 more steps x 4, then the test after step 6 (calls 37-42)
    with pytest.raises(KeyboardInterrupt):
        trainer.train(CountingGuide(interrupt_at=interrupt_at), RESUME_DATA, run_dir=run_dir, **RESUME_ARGS)
    saved = json.loads((run_dir / "checkpoint.json").read_text())
    step = 3 if interrupt_at == 21 else 6
    assert saved["step"] == step and saved["pending_metrics"]["step"] == step
    assert [m["step"] for m in RunDir(run_dir).metrics()] == list(range(1, step))  # its line is still owed

    trainer2, agent2, models2 = resume_trainer(cache)
    result = trainer2.train(CountingGuide(), RESUME_DATA, run_dir=run_dir, resume=True, **RESUME_ARGS)
    check_resumed(tmp_path, reference, run_dir, models, result, models2)
    metrics = RunDir(run_dir).metrics()
    ref_metrics = RunDir(tmp_path / "a").metrics()
    keys = ("step", "score", "accepted", "candidate_score", "test_score")
    assert [[m[k] for k in keys] for m in metrics] == [[m[k] for k in keys] for m in ref_metrics]


@pytest.mark.parametrize("tail", ['{"type": "rollout", "step": 4, "insta', '{"step": 3, "score"'])
def test_resume_repairs_a_torn_last_line(tmp_path, tail):
    reference = run_uninterrupted(tmp_path)
    run_dir = tmp_path / "b"
    trainer, _, _ = resume_trainer()
    trainer.train(CountingGuide(), RESUME_DATA, run_dir=run_dir, **{**RESUME_ARGS, "num_epochs": 1})
    for name in ("ledger.jsonl", "metrics.jsonl"):  # a crash in the middle of an append
        with open(run_dir / name, "a", encoding="utf-8") as handle:
            handle.write(tail)

    trainer2, agent2, _ = resume_trainer()
    result = trainer2.train(CountingGuide(), RESUME_DATA, run_dir=run_dir, resume=True, **RESUME_ARGS)
    assert result.final_parameters == reference[0].final_parameters
    for name in ("ledger.jsonl", "metrics.jsonl"):  # every line is whole JSON again
        lines = (run_dir / name).read_text(encoding="utf-8").split("\n")
        assert lines[-1] == "" and all(json.loads(line) for line in lines[:-1])
    assert ledger_shape(run_dir) == ledger_shape(tmp_path / "a")
    assert [m["step"] for m in RunDir(run_dir).metrics()] == [1, 2, 3, 4, 5, 6]


def test_lone_surrogates_are_cleaned_in_the_model_layer_and_kept_exact_in_the_ledger(tmp_path):
    broken = "caf\ud83d"  # what json.loads makes of a broken escape, in a reply or a tool's output

    class ToolAgent(LevelAgent):
        async def forward(self, x):
            answer = await super().forward(x)
            return answer if x else broken  # x=0: the output of a tool, not of a model

    brain = ScriptedModel(make_brain())
    agent_model = ScriptedModel(lambda messages: broken if messages[1]["content"] == "1" else "0")
    trainer = AggregatedUpdate(ToolAgent(agent_model), Optimizer(brain), llm=brain, proposals="per_instance", validation="minibatch", final_check=None)
    result = trainer.train(ExactMatchGuide(), dataset([0, 1]), batch_size=2, run_dir=tmp_path, **TRAIN)
    assert result.steps == 1 and result.stopped_reason is None
    rollouts = {r["instance_id"]: r for r in RunDir(tmp_path).ledger() if r["type"] == "rollout"}
    assert rollouts["x0"]["output"] == broken  # written and read back unchanged
    assert rollouts["x1"]["output"] == "caf\ufffd"  # a model's reply is made valid where it enters
    sent = [m["content"] for r in brain.requests for m in r["messages"]]
    assert all("\ud83d" not in text for text in sent) and any("caf\ufffd" in text for text in sent)
    assert json.loads((tmp_path / "checkpoint.json").read_text())["step"] == 1


# ------------------------------------------------------- failures that must be seen


class BoolGuide(Guide):
    def get_feedback(self, x, output, info):
        return output == info  # a bool is not a score


class TypoAgent(Agent):
    def __init__(self):
        self.prompt = Parameter("Answer.")

    def forward(self, x):
        return self.promt.value  # the typo a new user makes


def test_a_run_where_every_rollout_fails_stops_with_the_error(tmp_path, caplog):
    from opto import OptoError

    trainer, the_agent, agent_model, brain = make_trainer()
    with caplog.at_level("WARNING"), pytest.raises(TooManyFailures) as stopped:
        trainer.train(BoolGuide(), dataset([0, 1, 2, 3]), batch_size=2, run_dir=tmp_path, **TRAIN)
    assert isinstance(stopped.value, OptoError)
    assert "resume=True" in str(stopped.value) and str(tmp_path) in str(stopped.value)
    result = stopped.value.result
    assert result.steps == 0
    assert result.stopped_reason is not None
    assert "2 of 2 rollouts failed in step 1" in result.stopped_reason
    assert "BoolGuide.get_feedback returned bool" in result.stopped_reason
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "returned bool" in r.getMessage()]
    assert len(warnings) == 1  # the first failure of its kind, once
    assert brain.requests == []  # nothing was paid for on a run that cannot work
    assert json.loads((tmp_path / "checkpoint.json").read_text())["step"] == 0


def test_an_agent_typo_stops_the_run_and_names_the_error():
    trainer = AggregatedUpdate(TypoAgent(), Optimizer(ScriptedModel(["{}"])), proposals="per_instance", validation="minibatch", final_check=None)
    with pytest.raises(TooManyFailures) as stopped:
        trainer.train(ExactMatchGuide(), dataset([0, 1]), **TRAIN)
    assert "AttributeError" in str(stopped.value) and "promt" in str(stopped.value)
    assert "pass run_dir=" in str(stopped.value)  # how to keep such a run resumable


@pytest.mark.parametrize("max_failures, stops", [(1, True), (2, True), (3, False), (0.5, True), (1.0, False),
                                                 (None, False)])
def test_max_failures_counts_or_fractions(max_failures, stops):
    trainer, the_agent, agent_model, brain = make_trainer(agent_kwargs={"fail_on": {0, 1}})
    try:
        result = trainer.train(ExactMatchGuide(), dataset([0, 1, 2, 3]), batch_size=4, max_failures=max_failures,
                               **TRAIN)
    except TooManyFailures as stopped:
        assert stops
        result = stopped.result
    else:
        assert not stops
        assert result.train_failed == [2]  # counted, and scored 0 in the batch mean
        assert result.train_scores[0] <= 0.5
    assert result.steps == (0 if stops else 1)


def test_bad_max_failures_and_rollout_timeout_are_refused():
    trainer, *_ = make_trainer()
    for bad in (0, -1, 0.0, 1.5, "all", True):
        with pytest.raises((ValueError, TypeError), match="max_failures"):
            trainer.train(ExactMatchGuide(), dataset([0]), max_failures=bad, **TRAIN)
    with pytest.raises(ValueError, match="rollout_timeout"):
        trainer.train(ExactMatchGuide(), dataset([0]), rollout_timeout=0, **TRAIN)


def test_evaluate_raises_when_every_example_fails_unless_told_not_to():
    from opto import TooManyFailures

    the_agent = LevelAgent(ScriptedModel(agent_reply), fail_on={0, 1})
    with pytest.raises(TooManyFailures, match="2 of 2 rollouts failed in the evaluation"):
        evaluate(the_agent, ExactMatchGuide(), dataset([0, 1]))
    result = evaluate(the_agent, ExactMatchGuide(), dataset([0, 1]), max_failures=None)
    assert result.n_failed == 2


def test_a_failing_test_evaluation_stops_training_cleanly(tmp_path):
    trainer, the_agent, agent_model, brain = make_trainer(agent_kwargs={"fail_on": {7, 8}})
    with pytest.raises(TooManyFailures, match="failed in the evaluation") as stopped:
        trainer.train(ExactMatchGuide(), dataset([0, 1]), test_dataset=dataset([7, 8]), run_dir=tmp_path, **TRAIN)
    assert stopped.value.result.steps == 0 and (tmp_path / "checkpoint.json").exists()


def test_a_trainable_parameter_the_agent_never_reads_is_warned_about_once(caplog):
    class TwoKnobs(LevelAgent):
        def __init__(self, model):
            super().__init__(model)
            self.unused = Parameter("never read", description="a knob forward forgets")

    brain = ScriptedModel(make_brain())
    trainer = AggregatedUpdate(TwoKnobs(ScriptedModel(agent_reply)), Optimizer(brain), llm=brain, proposals="per_instance", validation="minibatch", final_check=None)
    with caplog.at_level("WARNING"):
        trainer.train(ExactMatchGuide(), dataset([0, 1, 2]), **TRAIN)
    unread = [r.getMessage() for r in caplog.records if "was not read" in r.getMessage()]
    assert len(unread) == 1 and "'unused' was not read in step 1's rollouts" in unread[0]
    assert "'system_prompt'" not in unread[0]


class Branchy(LevelAgent):
    """Reads `k` only on inputs of 5 and more: a branch, not a forgotten knob."""

    def __init__(self, model):
        super().__init__(model)
        self.k = Parameter(2, description="a multiplier used on large inputs")

    async def forward(self, x):
        answer = await super().forward(x)
        return str(x * self.k.value) if x >= 5 else answer


@pytest.mark.parametrize("order, warned", [([5, 0, 1], False), ([0, 5, 1], True)], ids=["read-first", "read-later"])
def test_a_parameter_read_in_some_branches_is_warned_about_only_while_never_read(caplog, order, warned):
    brain = ScriptedModel(make_brain())
    trainer = AggregatedUpdate(Branchy(ScriptedModel(agent_reply)), Optimizer(brain), llm=brain, proposals="per_instance", validation="minibatch", final_check=None)
    with caplog.at_level("WARNING"):
        trainer.train(ExactMatchGuide(), dataset(order), **TRAIN)
        trainer.train(ExactMatchGuide(), dataset(order), **TRAIN)  # once per run: a second run may say it again
    unread = [r.getMessage() for r in caplog.records if "'k' was not read" in r.getMessage()]
    assert unread == (["the trainable parameter 'k' was not read in step 1's rollouts (nor earlier in this run): "
                       "updates to it change nothing until the agent reads it (through .value inside forward)"] * 2
                      if warned else [])
    assert not any("never read" in r.getMessage() for r in caplog.records)


def test_a_hanging_agent_times_out_and_the_step_goes_on(tmp_path):
    class SlowOn9(LevelAgent):
        async def forward(self, x):
            if x == 9:
                await asyncio.sleep(3600)  # a tool call that never returns
            return await super().forward(x)

    brain = ScriptedModel(make_brain())
    trainer = AggregatedUpdate(SlowOn9(ScriptedModel(agent_reply)), Optimizer(brain), llm=brain, proposals="per_instance", validation="minibatch", final_check=None)
    result = trainer.train(ExactMatchGuide(), dataset([9, 0]), batch_size=2, rollout_timeout=0.2,
                           run_dir=tmp_path, **TRAIN)
    assert result.steps == 1 and result.stopped_reason is None and result.accepted == 1
    [timed_out] = [r for r in RunDir(tmp_path).ledger()
                   if r["type"] == "rollout" and r["phase"] == "train" and r["instance_id"] == "x9"]
    assert timed_out["error"].startswith("timeout:") and "rollout_timeout=0.2" in timed_out["error"]
    assert len(requests_of(brain, "optimizer")) == 1  # the other instance still made its proposal


def test_a_hanging_sync_agent_times_out_in_evaluate():
    import time as time_module

    class SyncSlow(Agent):
        def __init__(self):
            self.prompt = Parameter("p")

        def forward(self, x):
            if x == "1":
                time_module.sleep(1.0)
            return self.prompt.value

    result = evaluate(SyncSlow(), ExactMatchGuide(), [("0", "p"), ("1", "p")], rollout_timeout=0.1)
    assert result.scores[0] == 1.0 and result.n_failed == 1
    assert "rollout_timeout=0.1" in result.rollouts[1].error


def test_candidates_are_validated_at_the_same_time_and_recorded_in_order(tmp_path):
    in_flight, peak = [0], [0]

    async def slow_reply(messages):
        in_flight[0] += 1
        peak[0] = max(peak[0], in_flight[0])
        await asyncio.sleep(0.05)
        in_flight[0] -= 1
        return agent_reply(messages)

    brain = ScriptedModel(make_brain(delta=2))
    agent = LevelAgent(ScriptedModel(slow_reply))
    trainer = AggregatedUpdate(agent, Optimizer(brain), aggregator=Aggregator(brain, num_candidates=3),
                               concurrency=1, proposals="per_instance", validation="minibatch", final_check=None)
    trainer.train(ExactMatchGuide(), dataset([0, 1]), batch_size=2, run_dir=tmp_path, **TRAIN)
    assert peak[0] >= 2  # concurrency=1 per candidate's batch, yet several candidates ran at once
    ledger = RunDir(tmp_path).ledger()
    candidates = [r["candidate_id"] for r in ledger if r["type"] == "candidate"]
    decisions = [r["candidate_id"] for r in ledger if r["type"] == "decision"]
    assert decisions == candidates  # decisions in candidate order


def test_every_rollout_goes_through_the_executor(tmp_path):
    from opto.executors.local import AsyncioExecutor, RolloutExecutor

    class CountingExecutor(AsyncioExecutor):
        def __init__(self):
            super().__init__(concurrency=2)
            self.examples = 0

        async def run(self, agent, guide, examples, **kwargs):
            self.examples += len(examples)
            return await super().run(agent, guide, examples, **kwargs)

    executor = CountingExecutor()
    assert isinstance(executor, RolloutExecutor)
    brain = ScriptedModel(make_brain())
    agent_model = ScriptedModel(agent_reply)
    trainer = AggregatedUpdate(LevelAgent(agent_model), Optimizer(brain), llm=brain, executor=executor,
                               score_proposals="instance", validation="minibatch", proposals="per_instance")
    trainer.train(ExactMatchGuide(), dataset([0, 1]), batch_size=2, test_dataset=dataset([0, 1, 2]), **TRAIN)
    # test before (3) + the noise probe (2 examples twice) + the batch (2) + one proposal scored per
    # instance (2) + validation (2) + test after (3); the final check of this deterministic agent reads
    # what the search measured of the start and final values on the 2 examples, and runs nothing
    assert executor.examples == 16 == len(agent_model.requests)


def test_the_run_directory_holds_a_loadable_agent_per_example_evaluations_and_the_final_score(tmp_path):
    trainer, the_agent, agent_model, brain = make_trainer()
    result = trainer.train(ExactMatchGuide(), dataset([0, 1, 2]), test_dataset=dataset([0, 1, 5]),
                           eval_frequency=2, run_dir=tmp_path, **TRAIN)
    fresh = LevelAgent(ScriptedModel(agent_reply))
    fresh.load(tmp_path / "agent.json")
    assert fresh.system_prompt.value == the_agent.system_prompt.stored_value == "level 3"
    evaluations = RunDir(tmp_path).evaluations()
    assert sorted({e["step"] for e in evaluations}) == [0, 2, 3]
    assert all(set(e) == {"step", "example_id", "output", "score", "error"} for e in evaluations if e["step"] < 3)
    assert all(e["final"] is True for e in evaluations if e["step"] == 3)  # the final evaluation says so
    assert [e["score"] for e in evaluations if e["step"] == 3] == [1.0, 1.0, 0.0]
    final = RunDir(tmp_path).metrics()[-1]
    assert final == {"step": 3, "final": True, "test_score": result.final_test_score,
                     "test_interval": list(result.final_test_interval)}
    with pytest.raises(ValueError, match="training checkpoint, not saved values: load the run's agent.json"):
        fresh.load(tmp_path / "checkpoint.json")


def test_by_default_the_test_set_is_evaluated_only_at_the_start_and_the_end():
    trainer, the_agent, agent_model, brain = make_trainer()
    result = trainer.train(ExactMatchGuide(), dataset([0, 1, 2]), test_dataset=dataset([0, 1, 2, 3]), **TRAIN)
    assert [step for step, _ in result.test_scores] == [0, 3]
    # 3 steps x (1 rollout + 1 validation) + 2 evaluations x 4 examples
    assert len(agent_model.requests) == 3 * 2 + 2 * 4


def test_each_step_logs_one_line_with_its_outcome_and_the_cost_so_far(caplog):
    trainer, *_ = make_trainer()
    with caplog.at_level("INFO", logger="opto.trainer.session"):
        trainer.train(ExactMatchGuide(), dataset([0, 1]), **TRAIN)
    lines = [r.getMessage() for r in caplog.records if r.name == "opto.trainer.session" and "so far" in r.getMessage()]
    assert len(lines) == 2
    assert lines[0].startswith("step 1 (epoch 0): score 0.000, accepted (candidate 1.000);") and "calls" in lines[0]


def test_best_json_holds_the_values_with_the_best_validation_score(tmp_path):
    # levels 0 -> 1 -> 2 on a validation set of x in 0, 1, 2: level 2 scores 2/3, the best so far
    trainer, the_agent, agent_model, brain = make_trainer(validation=dataset([0, 1, 2]))
    trainer.train(ExactMatchGuide(), dataset([0, 1]), run_dir=tmp_path, **TRAIN)
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["parameters"] == {"system_prompt": "level 2"} and best["step"] == 2
    assert best["score"] == pytest.approx(2 / 3)
    assert json.loads((tmp_path / "checkpoint.json").read_text())["best"] == best


def test_the_evaluation_shows_its_own_progress(capsys):
    the_agent = LevelAgent(ScriptedModel(agent_reply), level=2)
    result = evaluate(the_agent, ExactMatchGuide(), dataset([0, 1, 2, 3]))
    assert "evaluation" not in capsys.readouterr().err  # quiet unless asked
    from opto.trainer.evaluation import aevaluate

    result = asyncio.run(aevaluate(the_agent, ExactMatchGuide(), dataset([0, 1, 2, 3]), progress=True))
    err = capsys.readouterr().err
    assert "evaluation" in err and "4/4" in err and "mean=0.500" in err
    assert result.mean == 0.5


def test_models_are_found_without_entering_modules_or_tripping_on_attributes_that_change():
    import types

    from opto.trainer.minibatch import models_in

    inner = ScriptedModel(agent_reply, name="inside-a-module")
    module = types.ModuleType("a_client_library")
    module.default_model = inner  # a library's own model: not the agent's

    class Parent:
        pass

    class Restless:  # reading its attributes adds one to its parent (as a lazy import does)
        def __init__(self, parent):
            self.parent = parent

        @property
        def __dict__(self):
            self.parent.added = object()
            return {"parent": self.parent}

    owned = ScriptedModel(agent_reply, name="owned")
    holder = Parent()
    holder.library, holder.model = module, owned
    holder.restless = Restless(holder)
    assert [m.name for m in models_in(holder)] == ["owned"]
