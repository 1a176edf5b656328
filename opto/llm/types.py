"""Value types of the model layer: messages, completions, token usage."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Completion", "Message", "TokenUsage", "content_text", "valid_unicode", "validate_messages"]

Message = dict[str, Any]
"""A chat message: {"role": "system" | "user" | "assistant", "content": str}."""

_ROLES = {"system", "user", "assistant", "developer", "tool"}


class TokenUsage(BaseModel):
    """Tokens a call used, as reported by the backend (estimated where it reports none)."""

    model_config = ConfigDict(frozen=True)

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class Completion(BaseModel):
    """The result of one `Model.complete` call.

    `texts` holds `n` samples. `finish_reason` is "length" when any sample was cut by
    the token limit (check `truncated`): such text is incomplete, not a full answer.
    """

    texts: list[str]
    finish_reason: str | None = "stop"
    usage: TokenUsage = Field(default_factory=TokenUsage)
    model: str = ""
    cached: bool = False

    @property
    def text(self) -> str:
        """The first sample."""
        return self.texts[0] if self.texts else ""

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


def validate_messages(messages: Any) -> list[Message]:
    """Check that `messages` is a non-empty list of {role, content} dicts; return a copy."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    checked: list[Message] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise ValueError(f"messages[{index}] must be a dict with 'role' and 'content' keys, got {message!r}")
        if message["role"] not in _ROLES:
            raise ValueError(f"messages[{index}] has unknown role {message['role']!r}; use one of {sorted(_ROLES)}")
        copy = dict(message)
        if isinstance(copy["content"], str):
            copy["content"] = valid_unicode(copy["content"])
        checked.append(copy)
    return checked


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
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


