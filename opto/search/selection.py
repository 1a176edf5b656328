"""Candidate selection: which values a step starts from, behind the `CandidateSelector` protocol.

`Greedy` keeps one incumbent: each step starts from the current values. The others keep
a pool of every candidate validated on the validation set (`opto.search.pool`) and draw
a parent from it each step: `Pareto` from its Pareto front, `EpsilonGreedy` the best
mean most of the time and any member otherwise, `TopK` any of the best k. Pool-based
runs end with the pool's best mean. A selector is a few lines: see the README's
"Choosing a strategy".
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from ..errors import OptoValueError
from .pool import CandidatePool, PoolEntry

__all__ = ["CandidateSelector", "EpsilonGreedy", "Greedy", "Pareto", "TopK"]


@runtime_checkable
class CandidateSelector(Protocol):
    """Picks the values a step starts from.

    `uses_pool`: keep every candidate validated on the validation set (which the run then
    needs) and end with the pool's best mean. `parent` is called before each step with
    a pool that is never empty and a generator seeded by (run seed, step); None keeps the
    current values.
    """

    name: str
    uses_pool: bool

    def parent(self, pool: CandidatePool, rng: np.random.Generator) -> PoolEntry | None: ...


class Greedy:
    """One incumbent: each step starts from the current values."""

    name = "greedy"
    uses_pool = False

    def parent(self, pool: CandidatePool, rng: np.random.Generator) -> PoolEntry | None:
        return None


class Pareto:
    """A member of the pool's Pareto front, weighted by the examples it is best on."""

    name = "pareto"
    uses_pool = True

    def parent(self, pool: CandidatePool, rng: np.random.Generator) -> PoolEntry | None:
        return pool.sample(rng)


class EpsilonGreedy:
    """The best mean, or with probability `epsilon` any member of the pool (a stuck
    incumbent gets other starting points to propose from)."""

    name = "epsilon_greedy"
    uses_pool = True

    def __init__(self, epsilon: float = 0.2) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise OptoValueError(f"epsilon must be within [0, 1], got {epsilon!r}")
        self.epsilon = epsilon

    def parent(self, pool: CandidatePool, rng: np.random.Generator) -> PoolEntry | None:
        if rng.random() < self.epsilon:
            return pool.entries[int(rng.integers(len(pool)))]
        return pool.best()


class TopK:
    """Any of the `k` best means, uniformly."""

    name = "top_k"
    uses_pool = True

    def __init__(self, k: int = 3) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise OptoValueError(f"k must be an int >= 1, got {k!r}")
        self.k = k

    def parent(self, pool: CandidatePool, rng: np.random.Generator) -> PoolEntry | None:
        best = pool.ranked()[: self.k]
        return best[int(rng.integers(len(best)))]
