"""Seeing model calls that do not go through opto's `Model`: instrumented OpenAI clients and LiteLLM.

Most agents call the OpenAI SDK or LiteLLM directly. `instrument(client)` wraps the
client's `chat.completions.create` (sync `openai.OpenAI` or async `openai.AsyncOpenAI`),
and `instrument_litellm()` wraps `litellm.completion` and `litellm.acompletion`, so every
call made inside a rollout is recorded in that rollout's trace exactly as a `Model`
call is (messages, reply, tool calls, tools offered, model, usage), counts towards the
run's usage, and is checked against a `Budget`. Outside a rollout nothing is recorded;
usage and the budget still count. `uninstrument(client)` / `uninstrument_litellm()` (or
the handle's `close()`) restore the originals.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any

from ..errors import OptoValueError
from .prices import known_price
from .reported import reported_usage
from .tracing import record_call, recorded_by_opto
from .types import Completion, TokenUsage, content_text, tool_calls_of, validate_messages
from .usage import (
    Budget,
    Price,
    budgets_for,
    charge_meters,
    cost_of,
    estimate_tokens,
    normalize_prices,
    reserve_all,
    settle_all,
)

__all__ = [
    "Instrumented",
    "count_and_record",
    "instrument",
    "instrument_litellm",
    "uninstrument",
    "uninstrument_litellm",
]

_ATTRIBUTE = "_opto_instrumented"


class Instrumented:
    """The handle of an instrumented client (or of LiteLLM): `close()` restores the originals."""

    def __init__(self, client: Any, target: Any, originals: dict[str, Any]) -> None:
        self.client = client  # the instrumented client, or the litellm module
        self._target = target  # the object whose functions were replaced
        self._originals = originals

    def close(self) -> None:
        for name, original in self._originals.items():
            setattr(self._target, name, original)
        if getattr(self.client, _ATTRIBUTE, None) is self:
            delattr(self.client, _ATTRIBUTE)


def instrument(
    client: Any, *, budget: Budget | None = None, prices: Mapping[str, Price | Mapping[str, float]] | None = None
) -> Instrumented:
    """Record `client`'s chat completions in rollout traces, usage and `budget`."""
    if getattr(client, _ATTRIBUTE, None) is not None:
        raise OptoValueError("this client is already instrumented; call uninstrument(client) first")
    completions = client.chat.completions
    handle = Instrumented(client, completions, {"create": completions.create})
    completions.create = _traced(completions.create, budget, prices)
    setattr(client, _ATTRIBUTE, handle)
    return handle


def instrument_litellm(
    *, budget: Budget | None = None, prices: Mapping[str, Price | Mapping[str, float]] | None = None
) -> Instrumented:
    """Record `litellm.completion` and `litellm.acompletion` calls like an instrumented client's.

    Code must call them through the module (`litellm.completion(...)`): a name imported
    before with `from litellm import completion` still points at the original function.
    """
    from .litellm_model import import_litellm

    litellm = import_litellm()
    if getattr(litellm, _ATTRIBUTE, None) is not None:
        raise OptoValueError("LiteLLM is already instrumented; call uninstrument_litellm() first")
    originals = {"completion": litellm.completion, "acompletion": litellm.acompletion}
    handle = Instrumented(litellm, litellm, originals)
    for name, original in originals.items():
        setattr(litellm, name, _traced(original, budget, prices, positional=("model", "messages")))
    setattr(litellm, _ATTRIBUTE, handle)
    return handle


def uninstrument_litellm() -> None:
    """Restore `litellm.completion` and `litellm.acompletion` (nothing happens when they are not wrapped)."""
    import sys

    litellm = sys.modules.get("litellm")
    handle = getattr(litellm, _ATTRIBUTE, None) if litellm is not None else None
    if handle is not None:
        handle.close()


def _traced(
    original: Any,
    budget: Budget | None,
    prices: Mapping[str, Price | Mapping[str, float]] | None,
    positional: tuple[str, ...] = (),
) -> Any:
    """`original` (a chat completion function, sync or async) recording every call.
    `positional` names its leading positional parameters (LiteLLM's model and messages)."""
    table = normalize_prices(prices)

    def price_of(model: str) -> Price | None:
        return table.get(model) or known_price(model)

    def before(kwargs: dict[str, Any]) -> tuple[list[Budget], list[tuple[int, float]]]:
        budgets = budgets_for(budget)  # the client's own and the run's (train(budget=...))
        if not budgets:
            return budgets, []
        prompt = sum(estimate_tokens(content_text(_plain(m).get("content"))) for m in kwargs.get("messages") or [])
        return budgets, reserve_all(budgets, prompt, price_of(str(kwargs.get("model", ""))))

    def after(kwargs: dict[str, Any], response: Any, reservation: tuple[list[Budget], list[tuple[int, float]]]) -> None:
        model = str(getattr(response, "model", None) or kwargs.get("model", ""))
        usage = _usage_of(response)
        settle_all(*reservation, usage, price_of(model))
        choices = getattr(response, "choices", None) or []
        texts = [getattr(c.message, "content", None) or "" for c in choices]
        reasons = [getattr(c, "finish_reason", None) for c in choices]
        calls = [tool_calls_of(c.message) for c in choices]
        completion = Completion(
            texts=texts or [""],
            finish_reason="length" if "length" in reasons else "stop",
            usage=usage,
            model=model,
            sample_tool_calls=calls if any(calls) else [],
        )
        messages = validate_messages(
            [_plain(m) for m in kwargs.get("messages") or []] or [{"role": "user", "content": ""}]
        )
        count_and_record(model, messages, completion, price_of(model), tools=kwargs.get("tools"))

    def failed(reservation: tuple[list[Budget], list[tuple[int, float]]], model: str) -> None:
        settle_all(*reservation, None, price_of(model))

    @functools.wraps(original)
    def create(*args: Any, **kwargs: Any) -> Any:
        request = {**dict(zip(positional, args)), **kwargs}
        reservation = before(request)
        try:
            with recorded_by_opto():  # an OpenTelemetry span of this call is not counted again
                response = original(*args, **kwargs)
        except BaseException:
            failed(reservation, str(request.get("model", "")))
            raise
        if not inspect.isawaitable(response):  # openai.OpenAI, litellm.completion
            after(request, response, reservation)
            return response

        async def finish() -> Any:  # openai.AsyncOpenAI, litellm.acompletion: in the awaiting task's trace
            try:
                with recorded_by_opto():
                    result = await response
            except BaseException:
                failed(reservation, str(request.get("model", "")))
                raise
            after(request, result, reservation)
            return result

        return finish()

    return create


def count_and_record(
    model: str,
    messages: list[Any],
    completion: Completion,
    price: Price | None,
    tools: list[dict[str, Any]] | None = None,
) -> None:
    """A call made outside opto's `Model` (an instrumented client, a DSPy LM): counted in
    the run's usage and recorded in the current rollout's trace."""
    charge_meters(model, completion.usage, cost_of(completion.usage, price))
    record_call(model, messages, completion, tools=tools)


def uninstrument(client: Any) -> None:
    """Restore a client `instrument` wrapped (nothing happens for one that is not)."""
    handle = getattr(client, _ATTRIBUTE, None)
    if handle is not None:
        handle.close()


def _usage_of(response: Any) -> TokenUsage:
    usage = getattr(response, "usage", None)
    if usage is None:
        return TokenUsage()
    return reported_usage(
        getattr(usage, "prompt_tokens", None),
        getattr(usage, "completion_tokens", None),
        source="an instrumented client's responses",
    )


def _plain(message: Any) -> Any:
    """A message as a dict: agents append the SDK's reply message objects to the conversation."""
    if hasattr(message, "model_dump"):
        return message.model_dump(exclude_none=True)
    return message
