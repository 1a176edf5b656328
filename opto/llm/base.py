"""The `Model` base class: caching, budget, usage and tracing around one backend call."""

from __future__ import annotations

import asyncio
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from ..errors import OptoValueError
from .cache import ResponseCache, request_key
from .context import close_records, open_records
from .errors import LLMTimeoutError
from .prices import known_price
from .sampling import current_sampling
from .tracing import record_call
from .types import Completion, Message, TokenUsage, ToolCall, valid_unicode, validate_messages
from .usage import (
    Budget,
    Price,
    Tally,
    UsageStats,
    areserve_all,
    budgets_for,
    charge_meters,
    close_sending,
    cost_of,
    estimate_prompt_tokens,
    normalize_prices,
    open_sending,
    settle_all,
)

__all__ = ["Model"]

logger = logging.getLogger(__name__)


class Model(ABC):
    """The protocol every backend follows, with the shared machinery built in.

    Subclasses implement `_generate`; `complete` adds input checks, the response cache,
    the budget, usage accounting and trace recording, the same for every backend.

    Args:
        name: the model name sent to the backend and used in cache keys and prices.
        cache: a `ResponseCache`; a hit costs nothing and is counted in `usage.cached_calls`.
        budget: a `Budget` checked before every call that is not a cache hit.
        prices: {model name: {"input": usd_per_1m_tokens, "output": usd_per_1m_tokens}};
            a name not in it gets the maintained price table's (`opto.llm.prices`), if any.
    """

    #: True for a backend that runs on this machine: its calls cost no money (cost estimates).
    local: bool = False
    #: True for a backend that calls `opto.llm.usage.request_sent()` right before its
    #: request goes out; for the others a call counts as sent once `_generate` runs.
    reports_sending: bool = False

    def __init__(
        self,
        name: str,
        *,
        cache: ResponseCache | None = None,
        budget: Budget | None = None,
        prices: Mapping[str, Price | Mapping[str, float]] | None = None,
    ) -> None:
        self.name = name
        self.cache = cache
        self.budget = budget
        self.prices = normalize_prices(prices)
        self._usage = Tally()
        self._usage_lock = threading.Lock()
        if budget is not None and budget.max_cost_usd is not None and self.price is None:
            logger.warning(
                "%s has no known price, so Budget(max_cost_usd=%s) cannot limit what it spends; give "
                "prices={%r: {'input': usd_per_1m_tokens, 'output': usd_per_1m_tokens}}",
                name,
                budget.max_cost_usd,
                name,
            )

    @property
    def usage(self) -> UsageStats:
        """Calls, cached calls, tokens and cost so far (a snapshot)."""
        with self._usage_lock:
            return self._usage.stats()

    @property
    def price(self) -> Price | None:
        """USD per million tokens: `prices=` first, then the table of well-known models."""
        return self.prices.get(self.name) or known_price(self.name)

    async def complete(
        self,
        messages: list[Message],
        *,
        response_format: dict[str, Any] | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        n: int = 1,
        seed: int | None = None,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        stop: list[str] | None = None,
        logprobs: bool = False,
    ) -> Completion:
        """Send a chat request and return `n` samples.

        `logprobs=True` asks for each sampled token's log-probability (OpenAI-compatible
        servers; on-policy RL needs them): they are in `completion.sample_logprobs`, in
        the trace and in the cache.

        `stop` ends a reply where one of its strings would begin (up to 4, as OpenAI
        allows); such a reply is complete (finish reason "stop"), not truncated.

        `tools` are function definitions in the OpenAI chat shape
        ({"type": "function", "function": {"name", "description", "parameters"}}) and
        `tool_choice` is "auto", "none", "required" or one function; the tool calls the
        model asks for are in the completion's `tool_calls`.

        Raises `BudgetExceeded` before a call that would go over the budget, and an
        `LLMError` subclass when the backend fails for good.
        """
        messages = validate_messages(messages)
        override = current_sampling()  # opto.collect draws samples: its temperature and seed win
        if override is not None:
            temperature = override.temperature if override.temperature is not None else temperature
            seed = override.seed if override.seed is not None else seed
        if not isinstance(n, int) or n < 1:
            raise OptoValueError(f"n must be a positive int, got {n!r}")
        if max_tokens is not None and max_tokens < 1:
            raise OptoValueError(f"max_tokens must be positive, got {max_tokens!r}")
        # Sent, and in the cache key, only when given.
        optional = {} if tools is None and tool_choice is None else _tool_options(tools, tool_choice)
        if stop is not None:
            if not isinstance(stop, list) or not 1 <= len(stop) <= 4 or not all(isinstance(x, str) and x for x in stop):
                raise OptoValueError(f"stop must be a list of 1 to 4 non-empty strings, got {stop!r}")
            optional["stop"] = stop
        if logprobs:
            optional["logprobs"] = True
        settings = {
            "response_format": response_format,
            "temperature": temperature,
            "max_tokens": max_tokens,
            "seed": seed,
            **optional,  # absent unless given, so the keys of earlier cached requests still match
        }
        if self.cache is None:  # nothing to look up or store: the backend's completion is the answer
            return self._finish(await self._paid_generate(messages, n, settings), messages, tools, max_tokens)
        request = {"model": self.name, "messages": messages, "n": n, **settings}  # keys sorted in the cache key
        keys = [request_key(request, i) for i in range(n)]
        texts: list[str | None] = [None] * n
        reasons: list[str | None] = [None] * n
        calls: list[list[ToolCall]] = [[] for _ in range(n)]
        tokens: list[list[dict[str, Any]]] = [[] for _ in range(n)]
        for i, key in enumerate(keys):
            hit = self.cache.get(key)
            if hit is not None:
                texts[i], reasons[i], calls[i], tokens[i] = hit
        missing = [i for i, text in enumerate(texts) if text is None]
        usage = TokenUsage()
        model_name = self.name
        if missing:
            fresh = await self._paid_generate(messages, len(missing), settings)
            usage, model_name = fresh.usage, fresh.model or self.name
            for j, (i, text) in enumerate(zip(missing, fresh.texts)):
                texts[i], reasons[i] = text, fresh.finish_reason
                calls[i] = fresh.sample_tool_calls[j] if j < len(fresh.sample_tool_calls) else []
                tokens[i] = fresh.sample_logprobs[j] if j < len(fresh.sample_logprobs) else []
                self.cache.put(keys[i], text, fresh.finish_reason, calls[i], tokens[i])
        else:
            with self._usage_lock:
                self._usage.count(None, 0.0)
            charge_meters(self.name, None, 0.0)
        completion = Completion(
            texts=[t or "" for t in texts],
            finish_reason="length" if "length" in reasons else (reasons[0] or "stop"),
            usage=usage,
            model=model_name,
            cached=not missing,
            sample_tool_calls=calls,
            sample_logprobs=tokens,
        )
        return self._finish(completion, messages, tools, max_tokens)

    def _finish(
        self, completion: Completion, messages: list[Message], tools: Any, max_tokens: int | None
    ) -> Completion:
        """The completion as `complete` returns it (tool calls named in its finish reason,
        no per-sample lists without content), recorded in the run's trace."""
        # Only what changes is assigned: each assignment to a pydantic model has a cost.
        calls = completion.sample_tool_calls
        if calls and not any(calls):
            completion.sample_tool_calls = calls = []
        reason = completion.finish_reason
        if not reason or (reason == "stop" and calls):
            completion.finish_reason = reason = "tool_calls" if calls else "stop"
        if completion.sample_logprobs and not any(completion.sample_logprobs):
            completion.sample_logprobs = []
        if not completion.model:
            completion.model = self.name
        if completion.truncated:
            logger.info("%s: a reply was cut at max_tokens=%s (finish_reason='length')", self.name, max_tokens)
        record_call(self.name, messages, completion, tools=tools)
        return completion

    async def _paid_generate(self, messages: list[Message], n: int, settings: dict[str, Any]) -> Completion:
        """One backend call for `n` samples with `settings` (`_generate`'s keywords), within
        the budgets, counted in the model's usage and the run's meters."""
        budgets = budgets_for(self.budget)  # the model's own and the run's (train(budget=...))
        reservations: list[tuple[int, float]] = []
        if budgets:
            reservations = await areserve_all(
                budgets, estimate_prompt_tokens(messages, settings.get("tools")), self.price
            )
        marked = open_records(by_opto=True)  # any backend: an OpenTelemetry span opened inside is not counted again
        mark, token = open_sending(not self.reports_sending)
        try:
            fresh = await self._generate(messages, n=n, **settings)
        except BaseException as exc:
            # A request that left and whose reply was not awaited (cancelled, timed out) is
            # paid all the same: counted, with its prompt's estimated tokens, so a budget
            # is never passed by calls it refunded. A refused or failed request is not.
            paid = mark.sent and isinstance(exc, (asyncio.CancelledError, LLMTimeoutError))
            spent = TokenUsage(prompt_tokens=estimate_prompt_tokens(messages, settings.get("tools"))) if paid else None
            settle_all(budgets, reservations, spent, self.price)  # not awaited: this may be a cancellation
            if spent is not None:
                self._count(spent)
            raise
        finally:
            close_sending(token)
            close_records(marked)
        for budget, reservation in zip(budgets, reservations):
            await budget.asettle(reservation, fresh.usage, self.price)
        texts = fresh.texts  # fixed in place: assigning a new list to the pydantic model would validate it
        for i, text in enumerate(texts):
            if not text.isascii():  # most replies: no surrogate possible
                texts[i] = valid_unicode(text)
        self._count(fresh.usage)
        return fresh

    def _count(self, usage: TokenUsage) -> None:
        """One paid call in the model's usage and the run's meters."""
        cost = cost_of(usage, self.price)
        with self._usage_lock:
            self._usage.count(usage, cost)
        charge_meters(self.name, usage, cost)

    @abstractmethod
    async def _generate(
        self,
        messages: list[Message],
        *,
        response_format: dict[str, Any] | None,
        temperature: float | None,
        max_tokens: int | None,
        n: int,
        seed: int | None,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        stop: list[str] | None = None,
        logprobs: bool = False,
    ) -> Completion:
        """Call the backend once for `n` samples (no cache, no budget: `complete` does those).

        `complete` passes `tools` and `tool_choice` only with tools, `stop` only with stop
        strings and `logprobs=True` only when asked, so a backend may leave out the ones it
        never supports; a backend that cannot call tools, or give logprobs, raises
        `UnsupportedRequestError` for them.
        """

    async def aclose(self) -> None:
        """Release the backend's resources (connections, threads)."""

    def close(self) -> None:
        """Synchronous `aclose` for scripts."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def __getstate__(self) -> dict[str, Any]:
        """A copy for another process (a Ray worker): no lock, and usage counted from zero
        there (the worker reports it to the run). Subclasses drop their connections."""
        state = dict(self.__dict__)
        state.pop("_usage_lock", None)
        state["_usage"] = Tally()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._usage_lock = threading.Lock()


def _tool_options(tools: Any, tool_choice: Any) -> dict[str, Any]:
    """{"tools": ..., "tool_choice": ...} as given (checked), or {} without tools."""
    if tools is None:
        if tool_choice is not None:
            raise OptoValueError("tool_choice needs tools: pass tools=[...] too")
        return {}
    if not isinstance(tools, list) or not tools:
        raise OptoValueError("tools must be a non-empty list of {'type': 'function', 'function': {...}} dicts")
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise OptoValueError(
                f"tools[{index}] must be {{'type': 'function', 'function': {{'name': ..., "
                f"'parameters': {{...}}}}}}, got {tool!r}"
            )
    options: dict[str, Any] = {"tools": tools}
    if tool_choice is not None:
        options["tool_choice"] = tool_choice
    return options
