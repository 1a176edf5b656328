"""Stop conditions for `train(stop=...)`, combined with `|` (any) and `&` (all).

A condition is checked before each step, on what the run has done so far (`RunProgress`:
its steps, calls, cost, time and best validation score, earlier sessions of a resumed
run included where the checkpoint has them). The first that holds ends the search: the
run then ends as a finished one does (the final values are chosen and the test set is
evaluated), and `TrainResult.stopped_reason` names the condition. Resuming such a run
with conditions that no longer hold goes on from the next step.

    from opto import MaxCalls, NoImprovement, StopFile, TargetScore
    trainer.train(guide, data, stop=MaxCalls(500) | NoImprovement(5) | TargetScore(0.9) | StopFile("STOP"))
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from ..errors import OptoTypeError, OptoValueError

__all__ = [
    "AllOf",
    "AnyOf",
    "MaxCalls",
    "MaxCost",
    "MaxMetricCalls",
    "MaxTime",
    "NoImprovement",
    "RunProgress",
    "StopCondition",
    "StopFile",
    "TargetScore",
]


@dataclass(frozen=True)
class RunProgress:
    """What a stop condition sees before a step.

    Attributes:
        step: steps completed (this session and earlier ones of a resumed run).
        calls: paid model calls so far (every model of the run, workers' included).
        cost_usd: their cost.
        seconds: time spent in this `train` call.
        best_score: the best validation score so far (what decisions compare), or None.
        best_step: the step that reached it (0: the starting values).
        reserved_calls: calls the run keeps for after its last step (the final check's
            first look: the start and the final values once on each of its examples).
            The check makes one rollout per call counted here.
        rollouts: rollouts so far (runs of agent and guide, failed ones too): what GEPA
            calls metric calls.
    """

    step: int
    calls: int
    cost_usd: float
    seconds: float
    best_score: float | None
    best_step: int
    reserved_calls: int = 0
    rollouts: int = 0


class StopCondition(ABC):
    """Base class: `check` returns why the run should stop now, or None."""

    @abstractmethod
    def check(self, progress: RunProgress) -> str | None: ...

    def __or__(self, other: StopCondition) -> AnyOf:
        return AnyOf(self, _checked(other))

    def __and__(self, other: StopCondition) -> AllOf:
        return AllOf(self, _checked(other))


def _checked(other: object) -> StopCondition:
    if not isinstance(other, StopCondition):
        raise OptoTypeError(f"stop conditions combine with other stop conditions, not {type(other).__name__}")
    return other


class AnyOf(StopCondition):
    """Stops when any of its conditions holds (`a | b`)."""

    def __init__(self, *conditions: StopCondition) -> None:
        self.conditions: list[StopCondition] = [
            c
            for condition in conditions
            for c in (condition.conditions if isinstance(condition, AnyOf) else [condition])
        ]

    def check(self, progress: RunProgress) -> str | None:
        for condition in self.conditions:
            reason = condition.check(progress)
            if reason is not None:
                return reason
        return None

    def __repr__(self) -> str:
        return " | ".join(map(repr, self.conditions))


class AllOf(StopCondition):
    """Stops when all of its conditions hold (`a & b`)."""

    def __init__(self, *conditions: StopCondition) -> None:
        self.conditions: list[StopCondition] = [
            c
            for condition in conditions
            for c in (condition.conditions if isinstance(condition, AllOf) else [condition])
        ]

    def check(self, progress: RunProgress) -> str | None:
        reasons = [condition.check(progress) for condition in self.conditions]
        return " and ".join(reasons) if all(r is not None for r in reasons) else None  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return "(" + " & ".join(map(repr, self.conditions)) + ")"


def _positive(name: str, value: float) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0 or math.isinf(value):
        raise OptoValueError(f"{name} needs a positive finite number, got {value!r}")
    return value


class MaxCalls(StopCondition):
    """Stops once the run has made `n` paid model calls, counting those it keeps for the
    final check (a soft limit, checked between steps: a step in progress finishes; for a
    hard cap use a `Budget`)."""

    def __init__(self, n: int) -> None:
        self.n = int(_positive("MaxCalls", n))

    def check(self, progress: RunProgress) -> str | None:
        if progress.calls + progress.reserved_calls < self.n:
            return None
        kept = f" (+{progress.reserved_calls} kept for the final check)" if progress.reserved_calls else ""
        return f"MaxCalls({self.n}): {progress.calls} calls made{kept}"

    def __repr__(self) -> str:
        return f"MaxCalls({self.n})"


class MaxMetricCalls(StopCondition):
    """Stops once the run has made `n` rollouts (GEPA's `max_metric_calls`: one per run of
    the agent and its metric on one example; a test-set evaluation is not one), counting
    those it keeps for the final check.

    Checked between steps, and also inside one when it stands alone or in an `|` (any) of
    conditions: a group of rollouts (a batch, a candidate's validation) that would pass
    `n` is not run, the step ends unfinished (kept in the ledger) and the run finishes
    with its final check, which may pass `n` by a noisy agent's second look."""

    def __init__(self, n: int) -> None:
        self.n = int(_positive("MaxMetricCalls", n))

    def check(self, progress: RunProgress) -> str | None:
        if progress.rollouts + progress.reserved_calls < self.n:
            return None
        kept = f" (+{progress.reserved_calls} kept for the final check)" if progress.reserved_calls else ""
        return f"MaxMetricCalls({self.n}): {progress.rollouts} metric calls made{kept}"

    def __repr__(self) -> str:
        return f"MaxMetricCalls({self.n})"


def metric_call_limit(stop: StopCondition | None) -> int | None:
    """The metric calls a run may not pass inside a step: the least `MaxMetricCalls` that
    stops it alone (on its own, or in an `|` of conditions), None when there is none."""
    if isinstance(stop, MaxMetricCalls):
        return stop.n
    if isinstance(stop, AnyOf):
        found = [n for n in (metric_call_limit(c) for c in stop.conditions) if n is not None]
        return min(found) if found else None
    return None


class MaxCost(StopCondition):
    """Stops once the run has spent `usd` dollars (models with a known price)."""

    def __init__(self, usd: float) -> None:
        self.usd = _positive("MaxCost", usd)

    def check(self, progress: RunProgress) -> str | None:
        return f"MaxCost(${self.usd:g}): ${progress.cost_usd:.4f} spent" if progress.cost_usd >= self.usd else None

    def __repr__(self) -> str:
        return f"MaxCost({self.usd:g})"


class MaxTime(StopCondition):
    """Stops once this `train` call has run for `seconds`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = _positive("MaxTime", seconds)

    def check(self, progress: RunProgress) -> str | None:
        if progress.seconds >= self.seconds:
            return f"MaxTime({self.seconds:g} s): {progress.seconds:.1f} s elapsed"
        return None

    def __repr__(self) -> str:
        return f"MaxTime({self.seconds:g})"


class NoImprovement(StopCondition):
    """Stops when the best validation score has not improved for `steps` steps."""

    def __init__(self, steps: int) -> None:
        self.steps = int(_positive("NoImprovement", steps))

    def check(self, progress: RunProgress) -> str | None:
        waited = progress.step - progress.best_step
        if waited >= self.steps:
            return f"NoImprovement({self.steps}): no better validation score since step {progress.best_step}"
        return None

    def __repr__(self) -> str:
        return f"NoImprovement({self.steps})"


class TargetScore(StopCondition):
    """Stops once the best validation score reaches `score`."""

    def __init__(self, score: float) -> None:
        if not isinstance(score, (int, float)) or isinstance(score, bool) or math.isnan(score):
            raise OptoValueError(f"TargetScore needs a number, got {score!r}")
        self.score = float(score)

    def check(self, progress: RunProgress) -> str | None:
        if progress.best_score is not None and progress.best_score >= self.score:
            return (
                f"TargetScore({self.score:g}): validation score {progress.best_score:.4f} at step {progress.best_step}"
            )
        return None

    def __repr__(self) -> str:
        return f"TargetScore({self.score:g})"


class StopFile(StopCondition):
    """Stops when the file `path` exists (create it to stop a run from outside, cleanly)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def check(self, progress: RunProgress) -> str | None:
        return f"StopFile: {self.path} exists" if self.path.exists() else None

    def __repr__(self) -> str:
        return f"StopFile({str(self.path)!r})"
