"""`ScriptedModel`: a deterministic model for tests and examples."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, Union

from ..errors import OptoTypeError
from .base import Model
from .errors import LLMError, LLMRequestError
from .types import Completion, Message, ToolCall
from .usage import estimated_usage

__all__ = ["ScriptedModel"]

ScriptItem = Union[str, Completion, BaseException]


class ScriptedModel(Model):
    """Replies from a script instead of a network.

    Args:
        responses: a list of replies returned in order, one per sample (an item may be
            a str, a `Completion` to set `finish_reason`, `sample_tool_calls` or
            `sample_logprobs` (given only when the call asks for logprobs), or an
            exception to raise), or a callable `fn(messages) -> str | Completion` (sync or
            async) called once per sample.
        name: the model name (used in cache keys and usage).

    Every request is recorded in `requests` (the keyword arguments and messages).
    """

    local = True

    def __init__(
        self,
        responses: Sequence[ScriptItem] | Callable[[list[Message]], Any],
        *,
        name: str = "scripted",
        **kwargs: Any,
    ) -> None:
        super().__init__(name, **kwargs)
        if callable(responses):
            self._fn: Callable[[list[Message]], Any] | None = responses
            self._script: list[ScriptItem] = []
        elif isinstance(responses, (str, bytes)):
            raise OptoTypeError("ScriptedModel takes a list of replies or a callable, not a single string")
        else:
            self._fn = None
            self._script = list(responses)
        self._position = 0
        self.requests: list[dict[str, Any]] = []

    @property
    def remaining(self) -> int:
        """Replies left in a list script."""
        return len(self._script) - self._position

    async def _generate(self, messages: list[Message], **kwargs: Any) -> Completion:
        self.requests.append({"messages": messages, **kwargs})
        texts: list[str] = []
        calls: list[list[ToolCall]] = []
        tokens: list[list[dict[str, Any]]] = []
        finish = "stop"
        for _ in range(kwargs["n"]):
            item: Any = await self._next(messages)
            if isinstance(item, BaseException):
                raise item
            sample_calls: list[ToolCall] = []
            sample_tokens: list[dict[str, Any]] = []
            if isinstance(item, Completion):
                finish = (item.finish_reason or finish) if item.truncated else finish
                sample_calls, sample_tokens = item.tool_calls, item.logprobs or []
                item = item.text or ""
            if not isinstance(item, str):
                raise OptoTypeError(f"ScriptedModel replies must be str, got {type(item).__name__}")
            if sample_calls and "tools" not in kwargs:
                raise LLMRequestError(
                    f"ScriptedModel {self.name!r}: a scripted tool call answers a request without tools="
                )
            texts.append(item)
            calls.append(sample_calls)
            tokens.append(sample_tokens if kwargs.get("logprobs") else [])
        usage = estimated_usage(messages, texts)
        return Completion(
            texts=texts,
            finish_reason=finish,
            usage=usage,
            model=self.name,
            sample_tool_calls=calls if any(calls) else [],
            sample_logprobs=tokens if any(tokens) else [],
        )

    async def _next(self, messages: list[Message]) -> Any:
        if self._fn is not None:
            reply = self._fn(messages)
            return await reply if inspect.isawaitable(reply) else reply
        if self._position >= len(self._script):
            raise LLMError(f"ScriptedModel {self.name!r} ran out of replies after {len(self._script)}")
        item = self._script[self._position]
        self._position += 1
        return item
