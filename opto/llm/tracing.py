"""Recording the model calls an agent makes while it runs.

The trainer opens `record_llm_calls()` around each agent run; every `Model.complete`
inside it (in the same task, or in tasks and threads started from it) is appended to
that run's trace, which the optimizer shows to the LLM.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from .types import Completion, Message

__all__ = ["LLMCall", "record_call", "record_llm_calls"]

LLMCall = dict[str, Any]
"""{"model": str, "messages": [...], "response": str, "cached": bool}"""

_TRACE: contextvars.ContextVar[list[LLMCall] | None] = contextvars.ContextVar("opto_llm_trace", default=None)


@contextlib.contextmanager
def record_llm_calls() -> Iterator[list[LLMCall]]:
    """Collect every model call made inside the block into the yielded list."""
    calls: list[LLMCall] = []
    token = _TRACE.set(calls)
    try:
        yield calls
    finally:
        _TRACE.reset(token)


def record_call(model: str, messages: list[Message], completion: Completion,
                tool_calls: list[dict[str, Any]] | None = None) -> None:
    """Append one call to the current run's trace (nothing happens outside a run)."""
    calls = _TRACE.get()
    if calls is not None:
        call: LLMCall = {"model": model, "messages": messages, "response": completion.text, "cached": completion.cached}
        if tool_calls:
            call["tool_calls"] = tool_calls
        calls.append(call)
