"""One error hierarchy for every model backend."""

from __future__ import annotations
from ..errors import OptoError

__all__ = [
    "BudgetExceeded",
    "LLMError",
    "LLMRequestError",
    "LLMUnavailableError",
]


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
