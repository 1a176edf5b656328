"""One error hierarchy for every model backend."""

from __future__ import annotations

from ..errors import OptoError
from .redaction import redact

__all__ = [
    "describe_error",
    "BudgetExceeded",
    "LLMError",
    "LLMRequestError",
    "LLMUnavailableError",
]


def describe_error(error: BaseException | None, text: str | None = None, limit: int = 500) -> str:
    """"Type status: message" for an error (the status when it has one), with any API key
    it holds redacted: the one way errors are described in logs, ledgers and messages."""
    if error is None:
        return "unknown error"
    status = getattr(error, "status_code", None)
    message = redact(text if text is not None else (getattr(error, "message", None) or str(error)))
    return f"{type(error).__name__}{f' {status}' if status else ''}: {message[:limit]}"


class LLMError(OptoError):
    """Base class of every error raised by the model layer."""


class LLMRequestError(LLMError):
    """The backend refused the request itself (a 4xx other than 429): retrying will not help."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class LLMUnavailableError(LLMError):
    """The backend kept failing (429, 5xx, timeouts, broken replies) after every retry."""

    def __init__(self, message: str, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


class BudgetExceeded(LLMError):
    """A call was refused before it was sent because it would go over a `Budget`."""
