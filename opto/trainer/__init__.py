"""Trainers: the `Minibatch` loop, `AggregatedUpdate` (its step), evaluation, rollout
collection, resume and the Trace-compatible `forward`/`update`."""

from .aggregated import AggregatedUpdate, InstanceOutput
from .collection import CollectResult, acollect, collect
from .evaluation import aevaluate, evaluate
from .failures import TooManyFailures
from .minibatch import Minibatch, StepContext, StepOutcome

__all__ = [
    "AggregatedUpdate",
    "CollectResult",
    "InstanceOutput",
    "Minibatch",
    "StepContext",
    "StepOutcome",
    "TooManyFailures",
    "aevaluate",
    "acollect",
    "collect",
    "evaluate",
]
