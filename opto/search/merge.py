"""Merging two lineages of a Pareto pool (GEPA's system-aware merge).

Two front members that descend from a common ancestor have each changed some parameters
since. The merge takes, parameter by parameter, the value of the lineage that changed it
(both changed it alike: that value; differently: the value of the parent with the better
mean; neither: the ancestor's). It is a candidate like any other: validated, and kept in
the pool with both parents.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

from pydantic import BaseModel

from .._util.files import json_key
from ..errors import OptoValueError
from .pool import CandidatePool, PoolEntry

__all__ = ["LineageMerge", "MergePlan"]


class MergePlan(BaseModel):
    """Which two pool members to merge, their common ancestor, and the merged values."""

    parent_id: str
    other_id: str
    ancestor_id: str
    values: dict[str, Any]
    taken_from: dict[str, str]  # parameter name -> the pool member its value comes from


class LineageMerge:
    """Every `every` steps, a merge of two front members with a common ancestor (if any is new).

    Args:
        every: steps between merges (a merge step makes no proposals).
    """

    def __init__(self, every: int) -> None:
        if not isinstance(every, int) or every < 1:
            raise OptoValueError(f"merge_every must be a positive number of steps, got {every!r}")
        self.every = every

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def plan(self, pool: CandidatePool, tried: set[str]) -> MergePlan | None:
        """The best-weighted pair of front members that has a common ancestor, neither
        descending from the other, whose merge is new; None when there is none."""
        front = pool.front()
        order = {entry.candidate_id: i for i, entry in enumerate(pool.entries)}  # ids are random: not a tie-break
        ranked = sorted(front, key=lambda cid: (-front[cid], order[cid]))
        for first, second in combinations(ranked, 2):
            a, b = pool.get(first), pool.get(second)
            if a is None or b is None:
                continue
            plan = _merge(pool, a, b)
            if plan is not None and json_key(plan.values) not in tried and pool.find(plan.values) is None:
                return plan
        return None


def _merge(pool: CandidatePool, a: PoolEntry, b: PoolEntry) -> MergePlan | None:
    lineage_a, lineage_b = pool.ancestors(a.candidate_id), pool.ancestors(b.candidate_id)
    if a.candidate_id in lineage_b or b.candidate_id in lineage_a:
        return None  # one descends from the other: nothing to combine
    common = next((cid for cid in lineage_a if cid in lineage_b), None)
    ancestor = pool.get(common) if common is not None else None
    if ancestor is None:
        return None
    better = a if (a.mean or float("-inf")) >= (b.mean or float("-inf")) else b
    values: dict[str, Any] = {}
    taken: dict[str, str] = {}
    for name in ancestor.values:
        old, left, right = ancestor.values[name], a.values.get(name), b.values.get(name)
        if left == old and right != old:
            values[name], taken[name] = right, b.candidate_id
        elif right == old and left != old:
            values[name], taken[name] = left, a.candidate_id
        elif left == right:
            values[name], taken[name] = left, (ancestor.candidate_id if left == old else a.candidate_id)
        else:
            values[name], taken[name] = better.values.get(name), better.candidate_id
    if values in (a.values, b.values):
        return None
    return MergePlan(
        parent_id=a.candidate_id,
        other_id=b.candidate_id,
        ancestor_id=ancestor.candidate_id,
        values=values,
        taken_from=taken,
    )
