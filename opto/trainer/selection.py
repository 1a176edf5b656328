"""Moved to `opto.search.pool` and `opto.search.selection`; this path keeps working."""

from ..search.pool import OBJECTIVES, START_ID, CandidatePool, PoolEntry, check_objectives, rollout_cost
from ..search.selection import CandidateSelector, EpsilonGreedy, Greedy, Pareto, TopK, make_selector

__all__ = [
    "OBJECTIVES",
    "START_ID",
    "CandidatePool",
    "CandidateSelector",
    "EpsilonGreedy",
    "Greedy",
    "Pareto",
    "PoolEntry",
    "TopK",
    "check_objectives",
    "make_selector",
    "rollout_cost",
]
