"""Latency distributions for `FakeOpenAIServer`: real model latencies are spread widely."""

from __future__ import annotations

import math
import random

from ...errors import OptoValueError

__all__ = ["LognormalLatency"]


class LognormalLatency:
    """Seconds drawn from a lognormal distribution: `median * exp(sigma * N(0, 1))`.

    With sigma 0.5, one call in ten takes more than 1.9x the median; real model
    latencies look like this. Seeded, so a sequence of draws is reproducible (which
    request gets which draw depends on the order they arrive in).

    Args:
        median: the median latency in seconds (> 0).
        sigma: the spread of the log latency (>= 0; 0 is a fixed latency).
        seed: the seed of the generator.
    """

    def __init__(self, median: float, sigma: float, seed: int = 0) -> None:
        if not median > 0:
            raise OptoValueError(f"median must be > 0 seconds, got {median!r}")
        if not sigma >= 0:
            raise OptoValueError(f"sigma must be >= 0, got {sigma!r}")
        self.median, self.sigma, self.seed = median, sigma, seed
        self._rng = random.Random(seed)

    def draw(self) -> float:
        """The next latency in seconds (not thread-safe: the server draws under its lock)."""
        return self.median * math.exp(self.sigma * self._rng.gauss(0.0, 1.0))

    def __repr__(self) -> str:
        return f"LognormalLatency(median={self.median!r}, sigma={self.sigma!r}, seed={self.seed!r})"
