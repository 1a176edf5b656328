"""Seeing model calls that do not go through opto's `Model`: an instrumented OpenAI client.

Most agents call the OpenAI SDK directly. `instrument(client)` wraps the client's
`chat.completions.create` (sync `openai.OpenAI` or async `openai.AsyncOpenAI`) so every
call made inside a rollout is recorded in that rollout's trace exactly as a `Model`
call is (messages, reply, tool calls, model, usage), counts towards the run's usage,
and is checked against a `Budget`. Outside a rollout nothing is recorded; usage and the
budget still count. `uninstrument(client)` (or the handle's `close()`) restores the client.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any

from .prices import known_price
from .tracing import record_call
from .types import Completion, TokenUsage, content_text, validate_messages
from .usage import Budget, Price, charge_meters, cost_of, estimate_tokens, normalize_prices

__all__ = ["Instrumented", "instrument", "uninstrument"]

_ATTRIBUTE = "_opto_instrumented"


class Instrumented:
    """The handle of an instrumented client: `close()` restores it."""

    def __init__(self, client: Any, original: Any) -> None:
        self.client = client
        self._original = original

    def close(self) -> None:
        completions = self.client.chat.completions
        completions.create = self._original
        if getattr(self.client, _ATTRIBUTE, None) is self:
            delattr(self.client, _ATTRIBUTE)


def instrument(client: Any, *, budget: Budget | None = None,
               prices: Mapping[str, Price | Mapping[str, float]] | None = None) -> Instrumented:
    """Record `client`'s chat completions in rollout traces, usage and `budget`."""
    if getattr(client, _ATTRIBUTE, None) is not None:
        raise ValueError("this client is already instrumented; call uninstrument(client) first")
    completions = client.chat.completions
    original = completions.create
    table = normalize_prices(prices)

    def price_of(model: str) -> Price | None:
        return table.get(model) or known_price(model)

    def before(kwargs: dict[str, Any]) -> tuple[int, float] | None:
        if budget is None:
            return None
        prompt = sum(estimate_tokens(content_text(m.get("content"))) for m in kwargs.get("messages") or [])
        return budget.reserve(prompt, price_of(str(kwargs.get("model", ""))))

    def after(kwargs: dict[str, Any], response: Any, reservation: tuple[int, float] | None) -> None:
        model = str(getattr(response, "model", None) or kwargs.get("model", ""))
        usage = _usage_of(response)
        if budget is not None and reservation is not None:
            budget.settle(reservation, usage, price_of(model))
        charge_meters(model, usage, cost_of(usage, price_of(model)))
        choices = getattr(response, "choices", None) or []
        texts = [getattr(c.message, "content", None) or "" for c in choices]
        reasons = [getattr(c, "finish_reason", None) for c in choices]
        tool_calls = [_tool_calls(c.message) for c in choices]
        completion = Completion(texts=texts or [""], finish_reason="length" if "length" in reasons else "stop",
                                usage=usage, model=model)
        messages = validate_messages(list(kwargs.get("messages") or []) or [{"role": "user", "content": ""}])
        record_call(model, messages, completion, tool_calls=[t for ts in tool_calls for t in ts] or None)

    def failed(reservation: tuple[int, float] | None, model: str) -> None:
        if budget is not None and reservation is not None:
            budget.settle(reservation, None, price_of(model))

    @functools.wraps(original)
    def create(*args: Any, **kwargs: Any) -> Any:
        reservation = before(kwargs)
        try:
            response = original(*args, **kwargs)
        except BaseException:
            failed(reservation, str(kwargs.get("model", "")))
            raise
        if not inspect.isawaitable(response):  # openai.OpenAI
            after(kwargs, response, reservation)
            return response

        async def finish() -> Any:  # openai.AsyncOpenAI: recorded in the awaiting task's trace
            try:
                result = await response
            except BaseException:
                failed(reservation, str(kwargs.get("model", "")))
                raise
            after(kwargs, result, reservation)
            return result

        return finish()

    completions.create = create
    handle = Instrumented(client, original)
    setattr(client, _ATTRIBUTE, handle)
    return handle


def uninstrument(client: Any) -> None:
    """Restore a client `instrument` wrapped (nothing happens for one that is not)."""
    handle = getattr(client, _ATTRIBUTE, None)
    if handle is not None:
        handle.close()


def _usage_of(response: Any) -> TokenUsage:
    usage = getattr(response, "usage", None)
    if usage is None:
        return TokenUsage()
    return TokenUsage(prompt_tokens=getattr(usage, "prompt_tokens", 0) or 0,
                      completion_tokens=getattr(usage, "completion_tokens", 0) or 0)


def _tool_calls(message: Any) -> list[dict[str, Any]]:
    calls = getattr(message, "tool_calls", None) or []
    return [{"id": getattr(c, "id", None), "name": getattr(getattr(c, "function", None), "name", None),
             "arguments": getattr(getattr(c, "function", None), "arguments", None)} for c in calls]

