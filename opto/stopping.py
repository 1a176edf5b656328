"""Moved to `opto.search.stopping`; this path keeps working."""

from .search.stopping import (
    AllOf,
    AnyOf,
    MaxCalls,
    MaxCost,
    MaxTime,
    NoImprovement,
    RunProgress,
    StopCondition,
    StopFile,
    TargetScore,
)

__all__ = [
    "AllOf",
    "AnyOf",
    "MaxCalls",
    "MaxCost",
    "MaxTime",
    "NoImprovement",
    "RunProgress",
    "StopCondition",
    "StopFile",
    "TargetScore",
]
