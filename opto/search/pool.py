"""The pool of validated candidates that pool-based selection draws parents from.

With a selector that keeps a pool (`"pareto"`, `"epsilon_greedy"`, `"top_k"`), every
candidate validated on the whole validation dataset is kept with its per-example
scores. Its *Pareto front* is the set of candidates that score best on at least one
validation example (Pareto selection draws from it, each member weighted by the number
of examples it is best on, so a candidate that solves examples no other one solves keeps
being explored even when its mean is lower). The run ends with the candidate of best
mean validation score.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from ..core.rollout import Rollout
from ..errors import OptoValueError

__all__ = ["CandidatePool", "OBJECTIVES", "PoolEntry", "START_ID", "check_objectives", "rollout_cost"]

OBJECTIVES = ("score", "cost", "latency")

#: The pool id of the values the run started from.
START_ID = "start"


def check_objectives(objectives: Sequence[str], uses_pool: bool) -> tuple[str, ...]:
    found = tuple(objectives)
    if not found or found[0] != "score" or len(set(found)) != len(found) or not set(found) <= set(OBJECTIVES):
        raise OptoValueError(
            f"objectives must be 'score' followed by any of 'cost', 'latency' (each once), got {found!r}"
        )
    if len(found) > 1 and not uses_pool:
        raise OptoValueError(
            "objectives beyond 'score' shape the pool's Pareto front: pass selection='pareto' with them"
        )
    return found


def rollout_cost(rollout: Rollout, objective: str) -> float | None:
    """What a rollout cost by `objective`: "cost" is dollars when priced, else tokens; "latency" seconds."""
    if objective == "latency":
        return rollout.seconds
    if rollout.cost_usd:
        return rollout.cost_usd
    return float(rollout.tokens) if rollout.tokens is not None else None


class PoolEntry(BaseModel):
    """One validated candidate: its full parameter values and per-example validation scores."""

    candidate_id: str
    values: dict[str, Any]
    scores: dict[str, float | None]
    from_step: int = 0
    parent_id: str | None = None
    # A merge of two lineages (`merge_every`) has a second parent.
    merge_parent_id: str | None = None
    # Mean cost per validation rollout by objective ("cost", "latency"), when kept.
    costs: dict[str, float] = Field(default_factory=dict)

    @property
    def mean(self) -> float | None:
        judged = [s for s in self.scores.values() if s is not None]
        return float(np.mean(judged)) if judged else None

    def cost_key(self, objectives: Sequence[str]) -> tuple[float, ...]:
        """The costs to minimize, in `objectives` order (unknown: the most expensive)."""
        return tuple(self.costs.get(o, float("inf")) for o in objectives if o != "score")


class CandidatePool(BaseModel):
    """The validated candidates of a run (saved in the checkpoint, so resume is exact).

    `objectives` beyond "score" ("cost", "latency") are more columns of the front: a
    candidate cheaper than every other at an equal or better score stays on it.
    """

    entries: list[PoolEntry] = Field(default_factory=list)
    objectives: tuple[str, ...] = ("score",)

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, candidate_id: str) -> PoolEntry | None:
        return next((e for e in self.entries if e.candidate_id == candidate_id), None)

    def find(self, values: Mapping[str, Any]) -> PoolEntry | None:
        """The entry holding exactly these values, if any."""
        return next((e for e in self.entries if e.values == dict(values)), None)

    def add(
        self,
        candidate_id: str,
        values: Mapping[str, Any],
        rollouts: Sequence[Rollout],
        *,
        step: int,
        parent_id: str | None,
        merge_parent_id: str | None = None,
    ) -> PoolEntry:
        costs: dict[str, float] = {}
        for objective in self.objectives[1:]:
            known = [c for c in (rollout_cost(r, objective) for r in rollouts) if c is not None]
            if known:
                costs[objective] = float(np.mean(known))
        entry = PoolEntry(
            candidate_id=candidate_id,
            values=dict(values),
            scores={r.example_id: r.score for r in rollouts},
            from_step=step,
            parent_id=parent_id,
            merge_parent_id=merge_parent_id,
            costs=costs,
        )
        self.entries.append(entry)
        return entry

    def front(self) -> dict[str, int]:
        """{candidate_id: number of validation examples it is best on}, for front members.

        Candidates dominated by another one (no better anywhere, worse somewhere) are left
        out first; then on each example every remaining candidate with the top score
        counts (ties share it). A candidate best on no example is not on the front.
        """
        examples = sorted({key for entry in self.entries for key in entry.scores})
        # Each objective beyond the score is one more column, negated: cheaper is better.
        table = {
            e.candidate_id: [_value(e.scores.get(x)) for x in examples] + [-c for c in e.cost_key(self.objectives)]
            for e in self.entries
        }
        alive = [cid for cid, row in table.items() if not any(_dominates(other, row) for other in table.values())]
        weights: dict[str, int] = {}
        for column in range(len(next(iter(table.values()), []))):
            top = max(table[cid][column] for cid in alive)
            if top == float("-inf"):
                continue  # nobody could be scored on this example
            for cid in alive:
                if table[cid][column] == top:
                    weights[cid] = weights.get(cid, 0) + 1
        return weights

    def sample(self, rng: np.random.Generator) -> PoolEntry:
        """A front member, drawn with probability proportional to its weight."""
        weights = self.front()
        if not weights:  # nothing could be scored: fall back to the newest candidate
            return self.entries[-1]
        ids = sorted(weights, key=lambda cid: self._position(cid))
        counts = np.array([weights[cid] for cid in ids], dtype=float)
        chosen = ids[int(rng.choice(len(ids), p=counts / counts.sum()))]
        return self.get(chosen)  # type: ignore[return-value]

    def ranked(self) -> list[PoolEntry]:
        """Every entry, best first (as `best` ranks them)."""
        return sorted(self.entries, key=self._rank, reverse=True)

    def best(self) -> PoolEntry:
        """The entry of best mean validation score; among equals the cheapest by the other
        objectives, then the earliest."""
        return max(self.entries, key=self._rank)

    def _rank(self, entry: PoolEntry) -> tuple[Any, ...]:
        return (
            float("-inf") if entry.mean is None else entry.mean,
            tuple(-c for c in entry.cost_key(self.objectives)),
            -self._position(entry.candidate_id),
        )

    def ancestors(self, candidate_id: str) -> list[str]:
        """Every ancestor of a candidate (both parents of a merge), nearest first, itself first."""
        order, queue = [], [candidate_id]
        while queue:
            current = queue.pop(0)
            entry = self.get(current)
            if entry is None or current in order:
                continue
            order.append(current)
            queue += [p for p in (entry.parent_id, entry.merge_parent_id) if p is not None]
        return order

    def _position(self, candidate_id: str) -> int:
        return next(i for i, e in enumerate(self.entries) if e.candidate_id == candidate_id)


def _value(score: float | None) -> float:
    return float("-inf") if score is None else score


def _dominates(a: list[float], b: list[float]) -> bool:
    return all(x >= y for x, y in zip(a, b)) and any(x > y for x, y in zip(a, b))
