"""Trainers: the `Minibatch` loop, `AggregatedUpdate`, evaluation and validation policies."""

from ..search.acceptance import (
    DatasetValidation,
    Decision,
    MinibatchFirst,
    MinibatchValidation,
    NoValidation,
    Validation,
)
from .aggregated import AggregatedUpdate, InstanceOutput
from .evaluation import EvalResult, aevaluate, evaluate
from .failures import TooManyFailures
from .minibatch import Minibatch, StepContext, StepOutcome, TrainResult

__all__ = [
    "AggregatedUpdate",
    "DatasetValidation",
    "Decision",
    "EvalResult",
    "InstanceOutput",
    "Minibatch",
    "MinibatchFirst",
    "MinibatchValidation",
    "NoValidation",
    "StepContext",
    "StepOutcome",
    "TooManyFailures",
    "TrainResult",
    "Validation",
    "aevaluate",
    "evaluate",
]
