"""One error hierarchy for every model backend, split by cause.

```
LLMError                      model, status_code, request_id, retry_after
├── LLMRequestError           refused; sending it again will not help
│   ├── AuthenticationError   401, 403: a missing, wrong or unauthorized key
│   ├── BadRequestError       400, 422 (also a ValueError)
│   │   └── ContextWindowExceededError   the prompt does not fit the model
│   ├── ModelNotFoundError    404: no such model on that server
│   ├── EndpointNotFoundError            404 for the route itself: the base URL is wrong (also a ValueError)
│   ├── UnsupportedRequestError          this backend cannot do what was asked (tools, logprobs)
│   └── QuotaExceededError    429 with insufficient_quota: waiting does not cure it
├── LLMUnavailableError       kept failing after every retry (attempts)
│   ├── RateLimitError        429s outlasted the patience
│   ├── ServerError           5xx or broken replies
│   ├── ConnectionFailedError            could not connect: refused, unknown host, TLS (also a ConnectionError)
│   └── LLMTimeoutError       timeouts (also a TimeoutError)
└── BudgetExceeded            refused before sending: over a Budget
```
"""

from __future__ import annotations

import re
from typing import Any

from .._util.redaction import redact
from ..errors import OptoError

__all__ = [
    "AuthenticationError",
    "BadRequestError",
    "BudgetExceeded",
    "ConnectionFailedError",
    "ContextWindowExceededError",
    "EndpointNotFoundError",
    "LLMError",
    "LLMRequestError",
    "LLMTimeoutError",
    "LLMUnavailableError",
    "ModelNotFoundError",
    "QuotaExceededError",
    "RateLimitError",
    "ServerError",
    "UnsupportedRequestError",
    "describe_error",
    "refused_request_error",
    "unavailable_error",
]


def describe_error(error: BaseException | None, text: str | None = None, limit: int = 500) -> str:
    """ "Type status: message" for an error (the status when it has one), with any API key
    it holds redacted: the one way errors are described in logs, ledgers and messages."""
    if error is None:
        return "unknown error"
    status = getattr(error, "status_code", None)
    message = redact(text if text is not None else (getattr(error, "message", None) or str(error)))
    return f"{type(error).__name__}{f' {status}' if status else ''}: {message[:limit]}"


class LLMError(OptoError):
    """Base class of every error raised by the model layer.

    Attributes, each None where the backend did not say: `model` (the model's name),
    `status_code` (the HTTP status), `request_id` (the server's id of the request, for its
    support) and `retry_after` (seconds the server asked to wait).
    """

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        status_code: int | None = None,
        request_id: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.model = model
        self.status_code = status_code
        self.request_id = request_id
        self.retry_after = retry_after


class LLMRequestError(LLMError):
    """The backend refused the request itself (a 4xx other than a passing 429): retrying will not help."""

    def __init__(self, message: str, status_code: int | None = None, **details: Any) -> None:
        super().__init__(message, status_code=status_code, **details)


class AuthenticationError(LLMRequestError):
    """401 or 403: the API key is missing, wrong, or not allowed to use this model."""


class BadRequestError(LLMRequestError, ValueError):
    """400 or 422: the server could not use the request (a parameter it rejects, a malformed message)."""


class ContextWindowExceededError(BadRequestError):
    """The messages and `max_tokens` do not fit the model's context window."""


class ModelNotFoundError(LLMRequestError):
    """404: the server has no such model (the message also names the URL that answered)."""


class EndpointNotFoundError(LLMRequestError, ValueError):
    """404 for the route itself: the server is there but has no chat completions route at
    that URL, so the base URL setting is wrong (often `/v1` is missing); the message names
    the URL requested and the setting to fix."""


class UnsupportedRequestError(LLMRequestError):
    """This backend cannot do what was asked (tools, logprobs): use a backend that can."""


class QuotaExceededError(LLMRequestError):
    """A 429 that says the account's quota is used up: waiting does not cure it."""


class LLMUnavailableError(LLMError):
    """The backend kept failing (429, 5xx, timeouts, broken replies) after every retry."""

    def __init__(self, message: str, attempts: int, **details: Any) -> None:
        super().__init__(message, **details)
        self.attempts = attempts


class RateLimitError(LLMUnavailableError):
    """The server kept answering 429 (rate limited) for longer than `rate_limit_patience`."""


class ServerError(LLMUnavailableError):
    """The server kept failing (5xx, or replies opto could not read) after every retry."""


class LLMTimeoutError(LLMUnavailableError, TimeoutError):
    """Requests kept timing out after every retry."""


class ConnectionFailedError(LLMUnavailableError, ConnectionError):
    """No connection could be made (refused, unknown host, a TLS failure) after a few quick
    retries; the message names the URL and the setting that chooses it."""


class BudgetExceeded(LLMError):
    """A call was refused before it was sent because it would go over a `Budget`."""


_CONTEXT_WINDOW = re.compile(
    r"context[ _]length|context[ _]window|maximum context|too many tokens|"
    r"prompt is too long|exceeds? the (model's )?max",
    re.I,
)


def refused_request_error(
    status: int | None,
    message: str,
    *,
    codes: tuple[Any, ...] = (),
    route_missing: bool = False,
    **details: Any,
) -> LLMRequestError:
    """The `LLMRequestError` subclass for a refused request: by status, the error codes the
    server gave and (for a context window, which servers report differently) the message.
    `route_missing`: a 404 that is about the URL, not the model (the caller read the body)."""
    if status == 429 or "insufficient_quota" in codes:
        kind: type[LLMRequestError] = QuotaExceededError
    elif status in (401, 403):
        kind = AuthenticationError
    elif status == 404:
        kind = EndpointNotFoundError if route_missing else ModelNotFoundError
    elif "context_length_exceeded" in codes or (status in (None, 400, 413, 422) and _CONTEXT_WINDOW.search(message)):
        kind = ContextWindowExceededError
    elif status in (400, 422):
        kind = BadRequestError
    else:
        kind = LLMRequestError
    return kind(message, status, **details)


def unavailable_error(
    message: str,
    attempts: int,
    *,
    status: int | None = None,
    timed_out: bool = False,
    unreachable: bool = False,
    malformed: bool = False,
    **details: Any,
) -> LLMUnavailableError:
    """The `LLMUnavailableError` subclass for the last failure of a request retried in vain
    (`unreachable`: no connection could be made at all)."""
    if timed_out:
        kind: type[LLMUnavailableError] = LLMTimeoutError
    elif unreachable:
        kind = ConnectionFailedError
    elif status == 429:
        kind = RateLimitError
    elif malformed or (status is not None and status >= 500):
        kind = ServerError
    else:
        kind = LLMUnavailableError  # the connection broke after it was made
    return kind(message, attempts, status_code=status, **details)
