"""One budget and one rate limit for every process of a run.

`Coordinator` holds copies of the run's `Budget`s and `RateLimiter`s (a Ray actor on a
`RayExecutor`, an object in the fake cluster). While rollouts run, the driver's own
budgets and limiters, and every copy unpickled on a worker, ask it before each call
(`opto.llm.shared_limits`). When no rollout runs, `CoordinatorHub.release` hands the
counts back to the driver's objects, so what a `Budget` says after a run is what the
whole run spent.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

from ..llm.errors import BudgetExceeded
from ..llm.ratelimit import RateLimiter
from ..llm.shared_limits import Link
from ..llm.types import TokenUsage
from ..llm.usage import Budget, Price

__all__ = ["Coordinator", "CoordinatorHub"]


class Coordinator:
    """Budgets and rate limiters by key; every method takes plain, picklable arguments."""

    def __init__(self) -> None:
        self._budgets: dict[str, Budget] = {}
        self._limiters: dict[str, RateLimiter] = {}
        self._handles: dict[int, Any] = {}
        self._ids = itertools.count(1)

    def add_budget(self, key: str, limits: dict[str, Any], spent: dict[str, Any]) -> None:
        budget = Budget(**limits)
        budget.detach(spent)  # start from what the driver counted so far
        self._budgets[key] = budget

    def reserve(self, key: str, prompt_tokens: int, price: Price | None) -> tuple[int, float] | dict[str, str]:
        try:
            return self._budgets[key].reserve(prompt_tokens, price)
        except BudgetExceeded as exc:  # an answer, not a failure of the coordinator
            return {"refused": str(exc)}

    def settle(self, key: str, reservation: tuple[int, float], usage: TokenUsage | None, price: Price | None) -> None:
        self._budgets[key].settle(reservation, usage, price)

    def charge(self, key: str, usage: TokenUsage, price: Price | None) -> str | None:
        return self._budgets[key].charge(usage, price)

    def remaining(self, key: str) -> dict[str, float | None]:
        return self._budgets[key].remaining()

    def budget_spent(self, key: str) -> dict[str, float]:
        return self._budgets[key].spent()

    def add_limiter(self, key: str, requests_per_minute: int | None, tokens_per_minute: int | None) -> None:
        self._limiters[key] = RateLimiter(requests_per_minute, tokens_per_minute)

    async def acquire(self, key: str, tokens: int) -> int:
        handle = await self._limiters[key].acquire(tokens)
        number = next(self._ids)
        if handle is not None:
            self._handles[number] = handle
        return number

    def record_actual(self, key: str, number: int, tokens: int) -> None:
        handle = self._handles.pop(number, None)
        self._limiters[key].record_actual(handle, tokens)


class CoordinatorHub:
    """The driver's side: attaches the budgets and limiters found while an agent is pickled,
    and detaches them when the last `run` that uses them ends."""

    def __init__(self, connect: Callable[[], Link]) -> None:
        self._connect = connect
        self._link: Link | None = None
        self._lock = threading.Lock()
        self._users = 0
        self._budgets: dict[str, Budget] = {}
        self._limiters: dict[str, RateLimiter] = {}

    @property
    def link(self) -> Link:
        """The coordinator, started on first use (a run without budgets or limits needs none)."""
        if self._link is None:
            self._link = self._connect()
        return self._link

    def hold(self) -> None:
        """A `run` starts using the coordinator."""
        with self._lock:
            self._users += 1

    def release(self) -> None:
        """A `run` ended; the last one hands the counts back to the driver's objects."""
        with self._lock:
            self._users -= 1
            if self._users > 0:
                return
            budgets, self._budgets = self._budgets, {}
            limiters, self._limiters = self._limiters, {}
        for key, budget in budgets.items():
            budget.detach(self.link.call("budget_spent", key))
        for limiter in limiters.values():
            limiter.detach()

    def attach_budget(self, budget: Budget) -> None:
        key = f"budget-{id(budget)}"
        self.link.call("add_budget", key, budget.limits, budget.spent())
        budget.attach(self.link, key)
        with self._lock:
            self._budgets[key] = budget

    def attach_limiter(self, limiter: RateLimiter) -> None:
        key = f"limiter-{id(limiter)}"
        self.link.call("add_limiter", key, limiter.requests_per_minute, limiter.tokens_per_minute)
        limiter.attach(self.link, key)
        with self._lock:
            self._limiters[key] = limiter
