"""Value types of the model layer: messages, completions, token usage."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..errors import OptoValueError

__all__ = [
    "Completion",
    "Message",
    "TokenUsage",
    "ToolCall",
    "content_text",
    "tool_calls_of",
    "valid_unicode",
    "validate_messages",
]

Message = dict[str, Any]
"""A chat message: {"role": "system" | "user" | "assistant", "content": str}; an assistant
message may carry "tool_calls" (its content may then be None), and a "tool" message
answers one of them by its "tool_call_id"."""

_ROLES = {"system", "user", "assistant", "developer", "tool"}


class TokenUsage(BaseModel):
    """Tokens a call used, as reported by the backend (estimated where it reports none).

    Counts are whole numbers >= 0 (anything else is a `ValidationError`); counts read
    from outside go through `opto.llm.reported.reported_usage`, which ignores bad ones.
    """

    model_config = ConfigDict(frozen=True, strict=True)

    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class ToolCall(BaseModel):
    """One tool call a model asked for: the function's name and its JSON arguments (as text,
    exactly as the model wrote them: they may not parse)."""

    model_config = ConfigDict(frozen=True)

    id: str = ""
    name: str
    arguments: str = "{}"

    def to_message_part(self) -> dict[str, Any]:
        """The OpenAI chat shape, for an assistant message's "tool_calls" list."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class Completion(BaseModel):
    """The result of one `Model.complete` call.

    `texts` holds `n` samples. `finish_reason` is "length" when any sample was cut by
    the token limit (check `truncated`): such text is incomplete, not a full answer.
    `sample_tool_calls[i]` holds the tool calls of sample i (empty without tools);
    `tool_calls` those of the first sample. With `complete(..., logprobs=True)`,
    `sample_logprobs[i]` holds sample i's tokens as OpenAI gives them
    ({"token", "logprob", ...}); `logprobs` those of the first sample.
    """

    texts: list[str]
    finish_reason: str | None = "stop"
    usage: TokenUsage = Field(default_factory=TokenUsage)
    model: str = ""
    cached: bool = False
    sample_tool_calls: list[list[ToolCall]] = Field(default_factory=list)
    sample_logprobs: list[list[dict[str, Any]]] = Field(default_factory=list)

    @property
    def text(self) -> str:
        """The first sample."""
        return self.texts[0] if self.texts else ""

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The first sample's tool calls."""
        return self.sample_tool_calls[0] if self.sample_tool_calls else []

    @property
    def logprobs(self) -> list[dict[str, Any]]:
        """The first sample's token logprobs (empty unless asked for)."""
        return self.sample_logprobs[0] if self.sample_logprobs else []

    def message(self, index: int = 0) -> Message:
        """Sample `index` as the assistant message to append to the conversation (with its
        tool calls, if any), e.g. before the tool results."""
        message: Message = {"role": "assistant", "content": self.texts[index] if index < len(self.texts) else ""}
        calls = self.sample_tool_calls[index] if index < len(self.sample_tool_calls) else []
        if calls:
            message["tool_calls"] = [call.to_message_part() for call in calls]
        return message

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


def validate_messages(messages: Any) -> list[Message]:
    """Check that `messages` is a non-empty list of {role, content} dicts; return a copy.

    An assistant message with "tool_calls" may leave out its content; a "tool" message
    needs the "tool_call_id" it answers.
    """
    if not isinstance(messages, (list, tuple)) or not messages:
        raise OptoValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    checked: list[Message] = []
    for index, message in enumerate(messages):
        if type(message) is not dict or message.get("role") not in _PLAIN_ROLES or "content" not in message:
            _check_message(index, message)  # raises, unless a tool call, a tool's result or a dict subclass
        copy = dict(message)
        content = copy.get("content")
        if isinstance(content, str) and not content.isascii():
            copy["content"] = valid_unicode(content)
        checked.append(copy)
    return checked


_PLAIN_ROLES = frozenset({"system", "user", "assistant", "developer"})  # no more than content to check


def _check_message(index: int, message: Any) -> None:
    """Raise what is wrong with `messages[index]`, if anything."""
    if not isinstance(message, dict) or "role" not in message:
        raise OptoValueError(f"messages[{index}] must be a dict with 'role' and 'content' keys, got {message!r}")
    if message["role"] not in _ROLES:
        raise OptoValueError(f"messages[{index}] has unknown role {message['role']!r}; use one of {sorted(_ROLES)}")
    calls_tools = message["role"] == "assistant" and bool(message.get("tool_calls"))
    if "content" not in message and not calls_tools:
        raise OptoValueError(f"messages[{index}] must be a dict with 'role' and 'content' keys, got {message!r}")
    if message["role"] == "tool" and not isinstance(message.get("tool_call_id"), str):
        raise OptoValueError(
            f"messages[{index}] is a tool message without the 'tool_call_id' of the call it "
            "answers; make it with opto.llm.tool_result(call, result)"
        )


def tool_calls_of(message: Any) -> list[ToolCall]:
    """The tool calls of a reply message, in OpenAI's shape (a dict or an SDK object)."""
    raw = message.get("tool_calls") if isinstance(message, dict) else getattr(message, "tool_calls", None)
    calls: list[ToolCall] = []
    for item in raw or []:
        function = item.get("function") if isinstance(item, dict) else getattr(item, "function", None)
        name = function.get("name") if isinstance(function, dict) else getattr(function, "name", None)
        arguments = function.get("arguments") if isinstance(function, dict) else getattr(function, "arguments", None)
        call_id = item.get("id") if isinstance(item, dict) else getattr(item, "id", None)
        if name:
            calls.append(
                ToolCall(
                    id=str(call_id or ""),
                    name=str(name),
                    arguments=arguments if isinstance(arguments, str) else json.dumps(arguments or {}),
                )
            )
    return calls


def content_text(content: Any) -> str:
    """The text of a message `content`: a string, or a list of typed parts whose texts are joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def valid_unicode(text: str) -> str:
    """`text` with lone surrogates (from a broken escape in some JSON) replaced by U+FFFD,
    so it can be cached, written to files and sent as UTF-8."""
    if text.isascii():  # most replies: no surrogate possible, and no copy made to find out
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text
