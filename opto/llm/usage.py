"""Usage accounting and spending limits shared by every model backend."""

from __future__ import annotations

import contextlib
import contextvars
import json
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel, Field

from ..errors import OptoValueError
from .context import Scope, current_records
from .errors import BudgetExceeded
from .shared_limits import Link, current_hub
from .types import TokenUsage

__all__ = ["Budget", "Price", "UsageMeter", "UsageStats", "estimate_tokens", "meter_usage"]


def estimate_tokens(text: str) -> int:
    """A rough token count (about four characters a token) for limits and backends that report none."""
    return max(1, len(text) // 4) if text else 0


def estimate_prompt_tokens(messages: list[Any], tools: Any = None) -> int:
    """A request's prompt tokens, estimated before it is sent: its messages and tools."""
    found = sum(estimate_tokens(str(m.get("content") or "")) for m in messages)
    return found + (estimate_tokens(json.dumps(tools)) if tools else 0)


def estimated_usage(messages: list[Any], texts: list[str]) -> TokenUsage:
    """The usage of a call that reports none: its messages' and replies' tokens, estimated."""
    return TokenUsage(prompt_tokens=estimate_prompt_tokens(messages),
                      completion_tokens=sum(estimate_tokens(t) for t in texts))  # fmt: skip


class Price(BaseModel):
    """USD per million tokens."""

    input: float
    output: float


class UsageStats(BaseModel):
    """What a model has used so far. `cached_calls` cost nothing and are not in the token counts."""

    calls: int = Field(default=0, ge=0)
    cached_calls: int = Field(default=0, ge=0)
    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    cost_usd: float = Field(default=0.0, ge=0)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: UsageStats) -> UsageStats:
        return UsageStats(
            calls=self.calls + other.calls,
            cached_calls=self.cached_calls + other.cached_calls,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
        )


def cost_of(usage: TokenUsage, price: Price | None) -> float:
    if price is None:
        return 0.0
    return (usage.prompt_tokens * price.input + usage.completion_tokens * price.output) / 1_000_000


def normalize_prices(prices: Mapping[str, Price | Mapping[str, float]] | None) -> dict[str, Price]:
    """Accept {"model": {"input": usd_per_1m, "output": usd_per_1m}} or Price objects."""
    return {name: p if isinstance(p, Price) else Price(**p) for name, p in (prices or {}).items()}


class Budget:
    """Limits on calls, tokens and cost, checked before every call; share one among models.

    A call is refused with `BudgetExceeded` when it would go over: its prompt tokens are
    estimated and reserved before it is sent, so concurrent calls cannot overshoot
    together; the reservation is replaced by the real usage when the reply arrives.
    Completion tokens are unknown in advance, so a token or cost limit can be passed by
    the completion of the last call allowed.

    On a `RayExecutor` the budget is held by the run's coordinator while rollouts run,
    so the driver and every worker count against the same figures.
    """

    def __init__(
        self,
        max_calls: int | None = None,
        max_tokens: int | None = None,
        max_cost_usd: float | None = None,
    ) -> None:
        for label, limit in (("max_calls", max_calls), ("max_tokens", max_tokens), ("max_cost_usd", max_cost_usd)):
            if limit is not None and limit < 0:
                raise OptoValueError(f"Budget {label} must be >= 0, got {limit}")
        self.max_calls = max_calls
        self.max_tokens = max_tokens
        self.max_cost_usd = max_cost_usd
        self._lock = threading.Lock()
        self.calls = 0
        self.tokens = 0
        self.cost_usd = 0.0
        # Set while a coordinator counts for this budget (a run on several processes).
        self._link: Link | None = None
        self._key: str | None = None
        # Why calls seen after the fact (`charge`) used the budget up, if they did.
        self.overrun: str | None = None

    def reserve(self, prompt_tokens: int, price: Price | None) -> tuple[int, float]:
        """Count one call and its estimated prompt tokens, or raise if that goes over."""
        if self._link is not None:
            return _refused_or(self._link.call("reserve", self._key, prompt_tokens, price))
        cost = cost_of(TokenUsage(prompt_tokens=prompt_tokens), price)
        with self._lock:
            if self.max_calls is not None and self.calls + 1 > self.max_calls:
                raise BudgetExceeded(f"budget of {self.max_calls} calls is used up")
            if self.max_tokens is not None and self.tokens + prompt_tokens > self.max_tokens:
                raise BudgetExceeded(
                    f"budget of {self.max_tokens} tokens: {self.tokens} used, this call needs about {prompt_tokens}"
                )
            if self.max_cost_usd is not None and self.cost_usd + cost > self.max_cost_usd:
                raise BudgetExceeded(f"budget of ${self.max_cost_usd:.4f}: ${self.cost_usd:.4f} spent")
            self.calls += 1
            self.tokens += prompt_tokens
            self.cost_usd += cost
        return prompt_tokens, cost

    def settle(self, reservation: tuple[int, float], usage: TokenUsage | None, price: Price | None) -> None:
        """Replace a reservation by what the call really used (None: the call was not paid)."""
        if self._link is not None:
            self._link.call("settle", self._key, tuple(reservation), usage, price)
            return
        tokens, cost = reservation
        with self._lock:
            self.tokens -= tokens
            self.cost_usd -= cost
            if usage is None:
                self.calls -= 1
            else:
                self.tokens += usage.total_tokens
                self.cost_usd += cost_of(usage, price)

    def charge(self, usage: TokenUsage, price: Price | None) -> str | None:
        """Count a call that was already made (seen after the fact, e.g. an OpenTelemetry
        span). Returns why the budget is now used up, or None; it is also kept in
        `overrun`, which stops a rollout when it ends (`run_rollout`)."""
        if self._link is not None:
            why = self._link.call("charge", self._key, usage, price)
        else:
            with self._lock:
                self.calls += 1
                self.tokens += usage.total_tokens
                self.cost_usd += cost_of(usage, price)
                why = self._used_up()
        if why is not None:
            self.overrun = why
        return why

    def _used_up(self) -> str | None:
        if self.max_calls is not None and self.calls >= self.max_calls:
            return f"budget of {self.max_calls} calls is used up ({self.calls} made)"
        if self.max_tokens is not None and self.tokens >= self.max_tokens:
            return f"budget of {self.max_tokens} tokens is used up ({self.tokens} used)"
        if self.max_cost_usd is not None and self.cost_usd >= self.max_cost_usd:
            return f"budget of ${self.max_cost_usd:.4f} is used up (${self.cost_usd:.4f} spent)"
        return None

    async def areserve(self, prompt_tokens: int, price: Price | None) -> tuple[int, float]:
        """`reserve` that awaits a shared budget's coordinator instead of blocking."""
        if self._link is not None:
            return _refused_or(await self._link.acall("reserve", self._key, prompt_tokens, price))
        return self.reserve(prompt_tokens, price)

    async def asettle(self, reservation: tuple[int, float], usage: TokenUsage | None, price: Price | None) -> None:
        """`settle` that awaits a shared budget's coordinator instead of blocking."""
        if self._link is not None:
            await self._link.acall("settle", self._key, tuple(reservation), usage, price)
        else:
            self.settle(reservation, usage, price)

    def remaining(self) -> dict[str, float | None]:
        if self._link is not None:
            return self._link.call("remaining", self._key)
        with self._lock:
            return {
                "calls": None if self.max_calls is None else self.max_calls - self.calls,
                "tokens": None if self.max_tokens is None else self.max_tokens - self.tokens,
                "cost_usd": None if self.max_cost_usd is None else self.max_cost_usd - self.cost_usd,
            }

    # Sharing across processes (see opto.llm.shared_limits).

    @property
    def limits(self) -> dict[str, float | None]:
        return {"max_calls": self.max_calls, "max_tokens": self.max_tokens, "max_cost_usd": self.max_cost_usd}

    def spent(self) -> dict[str, float]:
        """What was counted so far (calls, tokens, cost), as a dict."""
        with self._lock:
            return {"calls": self.calls, "tokens": self.tokens, "cost_usd": self.cost_usd}

    def attach(self, link: Link, key: str) -> None:
        """Hand the counting over to a coordinator (which must already hold this budget's state)."""
        self._link, self._key = link, key

    def detach(self, spent: Mapping[str, float]) -> None:
        """Count here again, from what the coordinator counted."""
        with self._lock:
            self.calls, self.tokens, self.cost_usd = int(spent["calls"]), int(spent["tokens"]), float(spent["cost_usd"])
        self._link = self._key = None

    def __getstate__(self) -> dict[str, Any]:
        if self._link is None and (hub := current_hub()) is not None:
            hub.attach_budget(self)
        state = {**self.limits, **self.spent(), "_link": self._link, "_key": self._key, "overrun": self.overrun}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


def _refused_or(answer: Any) -> tuple[int, float]:
    """A coordinator's answer to `reserve`: a reservation, or {"refused": why}."""
    if isinstance(answer, dict):
        raise BudgetExceeded(answer["refused"])
    return tuple(answer)


class Tally:
    """Running usage counts of one model: plain numbers, updated on every call and read
    rarely (as a `UsageStats`)."""

    __slots__ = ("calls", "cached_calls", "prompt_tokens", "completion_tokens", "cost_usd")

    def __init__(self) -> None:
        self.calls = self.cached_calls = self.prompt_tokens = self.completion_tokens = 0
        self.cost_usd = 0.0

    def count(self, usage: TokenUsage | None, cost: float) -> None:
        """One call: a paid one (its usage and cost) or a cache hit (None)."""
        if usage is None:
            self.cached_calls += 1
        else:
            self.calls += 1
            self.prompt_tokens += usage.prompt_tokens
            self.completion_tokens += usage.completion_tokens
            self.cost_usd += cost

    def add(self, stats: UsageStats) -> None:
        self.calls += stats.calls
        self.cached_calls += stats.cached_calls
        self.prompt_tokens += stats.prompt_tokens
        self.completion_tokens += stats.completion_tokens
        self.cost_usd += stats.cost_usd

    def stats(self) -> UsageStats:
        return UsageStats(
            calls=self.calls,
            cached_calls=self.cached_calls,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cost_usd=self.cost_usd,
        )


class UsageMeter:
    """Usage of every model call made inside a `meter_usage()` block, per model name.

    Calls made in tasks and threads started inside the block count too, so a trainer
    sees the agent's own calls as well as the optimizer's, each counted once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tallies: dict[str, Tally] = {}

    @property
    def by_model(self) -> dict[str, UsageStats]:
        """{model name: its usage} so far (a snapshot)."""
        with self._lock:
            return {model: tally.stats() for model, tally in self._tallies.items()}

    def charge(self, model: str, usage: TokenUsage | None, cost: float) -> None:
        with self._lock:
            tally = self._tallies.get(model)
            if tally is None:
                tally = self._tallies[model] = Tally()
            tally.count(usage, cost)

    def add(self, by_model: Mapping[str, UsageStats]) -> None:
        """Add usage counted by another meter."""
        with self._lock:
            for model, stats in by_model.items():
                self._tallies.setdefault(model, Tally()).add(stats)

    @property
    def total(self) -> UsageStats:
        return sum(self.by_model.values(), UsageStats())

    def tokens_and_cost(self) -> tuple[int, float]:
        """Paid tokens and their cost over every model (`total`'s, without building it)."""
        tokens, cost = 0, 0.0
        with self._lock:
            for tally in self._tallies.values():
                tokens += tally.prompt_tokens + tally.completion_tokens
                cost += tally.cost_usd
        return tokens, cost


def meter_usage() -> Scope[UsageMeter]:
    """Count the usage of model calls made inside the block (meters nest)."""
    meter = UsageMeter()
    return Scope(meter, meter=meter)


_RUN_BUDGETS: contextvars.ContextVar[tuple[Budget, ...]] = contextvars.ContextVar("opto_run_budgets", default=())


@contextlib.contextmanager
def budget_scope(*budgets: Budget) -> Iterator[None]:
    """Charge every model call made inside the block (tasks and threads started inside
    too) to `budgets` as well as to the model's own (`train(budget=...)` uses this)."""
    token = _RUN_BUDGETS.set((*_RUN_BUDGETS.get(), *budgets))
    try:
        yield
    finally:
        _RUN_BUDGETS.reset(token)


def current_meters() -> tuple[UsageMeter, ...]:
    """The meters of the enclosing `meter_usage` blocks."""
    return current_records().meters


def run_budgets() -> tuple[Budget, ...]:
    """The budgets of the enclosing `budget_scope` blocks."""
    return _RUN_BUDGETS.get()


def budgets_for(own: Budget | None) -> list[Budget]:
    """The budgets a call must fit: the model's own and those of the enclosing scopes (each once)."""
    found: list[Budget] = [] if own is None else [own]
    for budget in _RUN_BUDGETS.get():
        if all(budget is not other for other in found):
            found.append(budget)
    return found


def reserve_all(budgets: list[Budget], prompt_tokens: int, price: Price | None) -> list[tuple[int, float]]:
    """Reserve on every budget, or on none: a refusal releases what was reserved before it."""
    reservations: list[tuple[int, float]] = []
    try:
        for budget in budgets:
            reservations.append(budget.reserve(prompt_tokens, price))
    except BaseException:
        for budget, reservation in zip(budgets, reservations):
            budget.settle(reservation, None, price)
        raise
    return reservations


async def areserve_all(budgets: list[Budget], prompt_tokens: int, price: Price | None) -> list[tuple[int, float]]:
    """`reserve_all` that awaits shared budgets' coordinators."""
    reservations: list[tuple[int, float]] = []
    try:
        for budget in budgets:
            reservations.append(await budget.areserve(prompt_tokens, price))
    except BaseException:
        for budget, reservation in zip(budgets, reservations):
            budget.settle(reservation, None, price)
        raise
    return reservations


def settle_all(
    budgets: list[Budget], reservations: list[tuple[int, float]], usage: TokenUsage | None, price: Price | None
) -> None:
    for budget, reservation in zip(budgets, reservations):
        budget.settle(reservation, usage, price)


class Sending:
    """Whether the request of the call in progress has left this process. A backend that
    knows when it sends (`Model.reports_sending`) calls `request_sent()` right before;
    for the others a call is sent once their `_generate` runs."""

    __slots__ = ("sent",)

    def __init__(self, sent: bool) -> None:
        self.sent = sent


_SENDING: contextvars.ContextVar[Sending | None] = contextvars.ContextVar("opto_sending", default=None)


def open_sending(sent: bool) -> tuple[Sending, contextvars.Token[Sending | None]]:
    """The `Sending` mark of one backend call, seen by `request_sent` inside it, and the
    token `close_sending` takes (a pair of calls, not a context manager: every call
    pays for this)."""
    mark = Sending(sent)
    return mark, _SENDING.set(mark)


def close_sending(token: contextvars.Token[Sending | None]) -> None:
    _SENDING.reset(token)


def request_refused() -> None:
    """The server answered the request with an error (providers do not bill it): unless
    a retry sends it again, the call is not paid."""
    _mark_sent(False)


def request_sent() -> None:
    """A backend's request is about to go out: from now on the call is paid, whether or
    not its reply is awaited (a cancelled or timed-out call is not refunded)."""
    _mark_sent(True)


def _mark_sent(sent: bool) -> None:
    mark = _SENDING.get()
    if mark is not None:
        mark.sent = sent


def charge_meters(model: str, usage: TokenUsage | None, cost: float) -> None:
    """Called by `Model` for each call: a paid one (usage) or a cache hit (None)."""
    for meter in current_records().meters:
        meter.charge(model, usage, cost)


def add_to_meters(by_model: Mapping[str, UsageStats]) -> None:
    """Count usage measured elsewhere (a worker process's calls) in this task's meters."""
    for meter in current_records().meters:
        meter.add(by_model)
