"""Budgets and rate limits shared by processes: the hooks a distributed executor uses.

A `Budget` or `RateLimiter` pickled inside `shipping_to(hub)` is attached to `hub`
(an executor's coordinator): from then on it, and every copy unpickled in a worker,
asks the coordinator before each call through a `Link`, so one budget and one rate
limit hold for every process of a run. Pickled outside such a block, each is copied
with its state and limits the process that unpickles it only.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any, Protocol

__all__ = ["Link", "LimitsHub", "current_hub", "shipping_to"]


class Link(Protocol):
    """Calls on the coordinator that holds shared budgets and rate limits."""

    def call(self, method: str, *args: Any) -> Any:
        """Call `method` and wait for its result (blocks the caller)."""
        ...

    async def acall(self, method: str, *args: Any) -> Any:
        """Call `method` and await its result."""
        ...

    def send(self, method: str, *args: Any) -> None:
        """Call `method` without waiting for it."""
        ...


class LimitsHub(Protocol):
    """What attaches budgets and rate limiters to a coordinator while an agent is shipped."""

    def attach_budget(self, budget: Any) -> None: ...

    def attach_limiter(self, limiter: Any) -> None: ...


_HUB: contextvars.ContextVar[LimitsHub | None] = contextvars.ContextVar("opto_limits_hub", default=None)


def current_hub() -> LimitsHub | None:
    """The hub of the `shipping_to` block being pickled in, if any."""
    return _HUB.get()


@contextlib.contextmanager
def shipping_to(hub: LimitsHub) -> Iterator[None]:
    """Attach every `Budget` and `RateLimiter` pickled inside the block to `hub`."""
    token = _HUB.set(hub)
    try:
        yield
    finally:
        _HUB.reset(token)
