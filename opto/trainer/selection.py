"""Candidate selection: one greedy incumbent, or a Pareto pool of validated candidates.

With `selection="pareto"`, every candidate validated on the validation dataset is kept
with its per-example scores. Its *Pareto front* is the set of candidates that score
best on at least one validation example; each step starts from a front member drawn
with weight equal to the number of examples it is best on, so a candidate that
solves examples no other one solves keeps being explored even when its mean is
lower. The run ends with the candidate of best mean validation score.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from ..rollout import Rollout

__all__ = ["CandidatePool", "PoolEntry", "SELECTIONS", "check_selection"]

SELECTIONS = ("greedy", "pareto")

#: The pool id of the values the run started from.
START_ID = "start"


def check_selection(selection: str) -> str:
    if selection not in SELECTIONS:
        raise ValueError(f"selection must be 'greedy' or 'pareto', got {selection!r}")
    return selection


class PoolEntry(BaseModel):
    """One validated candidate: its full parameter values and per-example validation scores."""

    candidate_id: str
    values: dict[str, Any]
    scores: dict[str, float | None]
    from_step: int = 0
    parent_id: str | None = None

    @property
    def mean(self) -> float | None:
        judged = [s for s in self.scores.values() if s is not None]
        return float(np.mean(judged)) if judged else None


class CandidatePool(BaseModel):
    """The validated candidates of a run (saved in the checkpoint, so resume is exact)."""

    entries: list[PoolEntry] = Field(default_factory=list)

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, candidate_id: str) -> PoolEntry | None:
        return next((e for e in self.entries if e.candidate_id == candidate_id), None)

    def find(self, values: Mapping[str, Any]) -> PoolEntry | None:
        """The entry holding exactly these values, if any."""
        return next((e for e in self.entries if e.values == dict(values)), None)

    def add(self, candidate_id: str, values: Mapping[str, Any], rollouts: Sequence[Rollout], *, step: int,
            parent_id: str | None) -> PoolEntry:
        entry = PoolEntry(candidate_id=candidate_id, values=dict(values),
                          scores={r.example_id: r.score for r in rollouts}, from_step=step, parent_id=parent_id)
        self.entries.append(entry)
        return entry

    def front(self) -> dict[str, int]:
        """{candidate_id: number of validation examples it is best on}, for front members.

        Candidates dominated by another one (no better anywhere, worse somewhere) are left
        out first; then on each example every remaining candidate with the top score
        counts (ties share it). A candidate best on no example is not on the front.
        """
        examples = sorted({key for entry in self.entries for key in entry.scores})
        table = {e.candidate_id: [_value(e.scores.get(x)) for x in examples] for e in self.entries}
        alive = [cid for cid, row in table.items() if not any(_dominates(other, row) for other in table.values())]
        weights: dict[str, int] = {}
        for column in range(len(examples)):
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

    def best(self) -> PoolEntry:
        """The entry of best mean validation score (the earliest among equals)."""
        return max(self.entries, key=lambda e: (float("-inf") if e.mean is None else e.mean, -self._position(e.candidate_id)))

    def _position(self, candidate_id: str) -> int:
        return next(i for i, e in enumerate(self.entries) if e.candidate_id == candidate_id)


def _value(score: float | None) -> float:
    return float("-inf") if score is None else score


def _dominates(a: list[float], b: list[float]) -> bool:
    return all(x >= y for x, y in zip(a, b)) and any(x > y for x, y in zip(a, b))
