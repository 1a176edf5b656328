"""Stop conditions (`train(stop=...)`), the run budget (`train(budget=...)`) and its check
before the first step, and SIGTERM: each stops cleanly, names why, and the run resumes
to the ledger an uninterrupted run writes."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest

import world
from opto import (
    Budget,
    Callback,
    ExactMatchGuide,
    MaxCalls,
    MaxCost,
    MaxMetricCalls,
    MaxTime,
    NoImprovement,
    RunDir,
    StopFile,
    TargetScore,
)
from opto.search.stopping import AllOf, AnyOf, RunProgress, metric_call_limit
from world import ledger_of

DATA = world.dataset(range(8))
PRICES = {"agent-model": {"input": 1.0, "output": 1.0}, "brain": {"input": 1.0, "output": 1.0}}


def progress(**changes: Any) -> RunProgress:
    base = {"step": 3, "calls": 50, "cost_usd": 0.5, "seconds": 10.0, "best_score": 0.6, "best_step": 2}
    return RunProgress(**{**base, **changes})


def test_each_condition_holds_exactly_when_its_figure_is_reached(tmp_path):
    assert MaxCalls(50).check(progress()) and not MaxCalls(51).check(progress())
    assert MaxCost(0.5).check(progress()) and not MaxCost(0.6).check(progress())
    assert MaxTime(10).check(progress()) and not MaxTime(11).check(progress())
    assert NoImprovement(1).check(progress()) and not NoImprovement(2).check(progress())
    assert TargetScore(0.6).check(progress()) and not TargetScore(0.61).check(progress())
    assert not TargetScore(0.1).check(progress(best_score=None))
    stop_file = tmp_path / "STOP"
    assert not StopFile(stop_file).check(progress())
    stop_file.touch()
    assert "STOP exists" in StopFile(stop_file).check(progress())


def test_conditions_combine_with_or_and_and():
    either = MaxCalls(100) | TargetScore(0.5)
    assert isinstance(either, AnyOf) and "TargetScore" in either.check(progress())
    both = MaxCalls(10) & TargetScore(0.9)
    assert isinstance(both, AllOf) and both.check(progress()) is None
    assert "MaxCalls" in (MaxCalls(10) & TargetScore(0.5)).check(progress())
    assert len((MaxCalls(1) | MaxTime(1) | NoImprovement(1)).conditions) == 3  # flattened
    with pytest.raises(TypeError, match="combine"):
        MaxCalls(1) | 3  # type: ignore[operator]
    for bad in (lambda: MaxCalls(0), lambda: MaxCost(-1), lambda: MaxTime(float("inf")), lambda: NoImprovement(0),
                lambda: TargetScore(float("nan"))):
        with pytest.raises(ValueError):
            bad()


def train(run_dir: Path, *, resume: bool = False, delta: int = 1, agent_kwargs: dict[str, Any] | None = None,
          callbacks: list[Any] | None = None, **kwargs: Any) -> Any:
    trainer, *_ = world.make_level_trainer(level=0, delta=delta, agent_kwargs=agent_kwargs,
                                           agent_model_kwargs={"prices": PRICES}, brain_model_kwargs={"prices": PRICES})
    return trainer.train(ExactMatchGuide(), DATA, batch_size=2, run_dir=run_dir, resume=resume, progress=False,
                         shuffle=False, test_dataset=DATA[:4], callbacks=callbacks, **kwargs)


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp("whole")
    return path, train(path)


class TouchAfterStep(Callback):
    def __init__(self, path: Path, step: int) -> None:
        self.path, self.step = path, step

    def on_step_end(self, record: Any) -> None:
        if record.step == self.step:
            self.path.touch()


@pytest.mark.parametrize("condition", ["MaxCalls", "MaxCost", "NoImprovement", "TargetScore", "StopFile"])
def test_a_run_stopped_by_a_condition_ends_cleanly_and_resumes_to_the_same_ledger(condition, whole, tmp_path):
    whole_dir, whole_result = whole
    stop_file = tmp_path / "STOP"
    stop = {"MaxCalls": MaxCalls(9), "MaxCost": MaxCost(0.0001), "NoImprovement": NoImprovement(1),
            "TargetScore": TargetScore(0.5), "StopFile": StopFile(stop_file)}[condition]
    callbacks = [TouchAfterStep(stop_file, 2)] if condition == "StopFile" else None
    run_dir = tmp_path / "run"
    stopped = train(run_dir, stop=stop, callbacks=callbacks)
    assert stopped.stopped_reason is not None and stopped.stopped_reason.startswith(condition)
    assert 0 < stopped.steps < whole_result.steps
    assert stopped.test_scores[-1][0] == stopped.steps  # the final evaluation ran at the stop
    again = train(run_dir, resume=True, stop=stop)  # the condition still holds: nothing more happens
    assert again.steps == stopped.steps and again.stopped_reason.startswith(condition)
    resumed = train(run_dir, resume=True)
    assert resumed.stopped_reason is None and resumed.steps == whole_result.steps
    assert resumed.final_parameters == whole_result.final_parameters
    assert ledger_of(run_dir) == ledger_of(whole_dir)


def test_no_improvement_counts_steps_since_the_best_validation_score(tmp_path):
    result = train(tmp_path, delta=0, stop=NoImprovement(2))  # the brain never changes the level
    assert result.steps == 2 and "since step" in result.stopped_reason


def test_max_time_is_checked_before_the_first_step_too(tmp_path):
    result = train(tmp_path, stop=MaxTime(1e-6))
    assert result.steps == 0 and result.stopped_reason.startswith("MaxTime")
    assert train(tmp_path, resume=True).steps == 4


def test_a_budget_that_cannot_pay_for_one_step_is_refused_before_any_call(tmp_path):
    trainer, _, agent_model, brain = world.make_level_trainer(level=0)
    with pytest.raises(ValueError) as caught:
        trainer.train(ExactMatchGuide(), DATA, batch_size=2, budget=Budget(max_calls=8), test_dataset=DATA[:4],
                      progress=False)
    message = str(caught.value)
    assert "train(budget=...) has 8 calls left" in message and "at least 11" in message
    assert "4 for the initial test evaluation" in message and "2 for validation" in message
    assert not agent_model.requests and not brain.requests


def test_a_models_budget_is_checked_for_the_calls_that_go_through_it():
    trainer, _, agent_model, brain = world.make_level_trainer(level=0, agent_model_kwargs={"budget": Budget(max_calls=3)})
    with pytest.raises(ValueError, match="the agent's model 'agent-model' has 3 calls left.*at least 4"):
        trainer.train(ExactMatchGuide(), DATA, batch_size=2, progress=False)
    shared = Budget(max_calls=5)  # one budget for agent and brain: it pays for every call of a step
    trainer, *_ = world.make_level_trainer(level=0, agent_model_kwargs={"budget": shared},
                                           brain_model_kwargs={"budget": shared})
    with pytest.raises(ValueError, match="'agent-model' and .*'brain' has 5 calls left.*at least 7"):
        trainer.train(ExactMatchGuide(), DATA, batch_size=2, progress=False)


def test_the_run_budget_counts_every_call_and_the_stopped_run_resumes(whole, tmp_path):
    whole_dir, whole_result = whole
    budget = Budget(max_calls=16)
    stopped = train(tmp_path, budget=budget)
    assert stopped.stopped_reason.startswith("budget exceeded") and budget.calls == 16
    assert stopped.usage.calls == 16  # every paid call of the run went through the run's budget
    resumed = train(tmp_path, resume=True)
    assert resumed.final_parameters == whole_result.final_parameters
    assert ledger_of(tmp_path) == ledger_of(whole_dir)


def test_sigterm_stops_after_saving_and_the_run_resumes(whole, tmp_path):
    whole_dir, whole_result = whole
    terminated: list[int] = []
    # opto leaves a handler the program set alone (Ray's driver sets one, and an earlier
    # test module may have started Ray in this process): start from the default.
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)

    class TermDuringStep(world.LevelAgent):
        async def forward(self, x: Any) -> str:
            if x == 4 and not terminated:  # in step 3's batch
                terminated.append(x)
                if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # would end the test process
                    raise AssertionError("train() did not install its SIGTERM handler")
                os.kill(os.getpid(), signal.SIGTERM)
                await asyncio.sleep(0.5)
            return await super().forward(x)

    original = world.LevelAgent
    world.LevelAgent = TermDuringStep
    try:
        stopped = train(tmp_path)
    finally:
        world.LevelAgent = original
        removed = signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        signal.signal(signal.SIGTERM, previous)
    assert stopped.stopped_reason == "SIGTERM" and stopped.steps == 2
    assert removed  # train() put the default back
    resumed = train(tmp_path, resume=True)
    assert resumed.final_parameters == whole_result.final_parameters
    assert ledger_of(tmp_path) == ledger_of(whole_dir)


def test_max_metric_calls_counts_rollouts_and_holds_inside_a_step(tmp_path):
    """Without a limit, a run's rollouts (test evaluations left out) are its metric calls;
    with one that a step would pass, the step's rollouts that would pass it never run."""
    free = train(tmp_path / "free")
    assert free.metric_calls > 0
    assert free.metric_calls == free.steps * 2 * 2  # each step: the batch, and the candidate on it
    limit = free.metric_calls - 3  # the last step's candidate rollouts would pass it
    held = train(tmp_path / "held", stop=MaxMetricCalls(limit))
    assert held.metric_calls <= limit and held.stopped_reason.startswith("MaxMetricCalls")
    assert "unfinished" in held.stopped_reason and held.steps == free.steps - 1
    assert held.test_scores[-1][0] == held.steps  # the run finished: its final evaluation ran
    saved = RunDir(tmp_path / "held").load_checkpoint()
    assert saved is not None and saved.rollouts == held.metric_calls
    more = train(tmp_path / "held", resume=True, stop=MaxMetricCalls(limit + 8))
    assert more.metric_calls <= limit + 8 and more.metric_calls > held.metric_calls  # earlier sessions count


def test_metric_call_limits_are_found_only_where_they_alone_stop_a_run():
    assert metric_call_limit(MaxMetricCalls(9)) == 9
    assert metric_call_limit(MaxTime(5) | MaxMetricCalls(9) | MaxMetricCalls(4)) == 4
    assert metric_call_limit(MaxMetricCalls(9) & MaxTime(5)) is None and metric_call_limit(None) is None
    assert MaxMetricCalls(10).check(progress(rollouts=7, reserved_calls=3)) is not None
    assert MaxMetricCalls(10).check(progress(rollouts=7, reserved_calls=2)) is None
