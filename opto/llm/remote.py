"""`RemoteChatModel`: what every network chat backend shares (limits, retries, a private loop)."""

from __future__ import annotations

import abc
import asyncio
import errno
import json
import logging
import re
import socket
import ssl
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import openai

from .._util.redaction import redact
from ..errors import OptoValueError, UsageError
from ._gate import SharedSemaphore
from ._loop import BackgroundLoop
from ._per_loop import PerLoop
from .base import Model
from .errors import LLMRequestError, describe_error, refused_request_error, unavailable_error
from .ratelimit import RateLimiter
from .reported import reported_tokens
from .retry import (
    CONNECT_BACKOFF_BASE,
    CONNECT_BACKOFF_CAP,
    CONNECT_RETRIES,
    backoff_delay,
    retry_after_delay,
    retry_after_seconds,
)
from .types import Completion, Message, ToolCall, tool_calls_of
from .usage import estimate_prompt_tokens, estimate_tokens, request_refused, request_sent

__all__ = ["Poster", "RemoteChatModel", "connect_failure", "public_url"]

logger = logging.getLogger(__name__)

# Failures worth another try without a status: unreachable, timed out, or a broken reply.
_TRANSIENT = (
    openai.APIConnectionError,  # includes APITimeoutError
    openai.APIResponseValidationError,
    json.JSONDecodeError,
)


def _is_transient_status(status: int) -> bool:
    """Busy, broken for a moment, request timeout or conflict (as the SDK retries them)."""
    return status in (408, 409, 429) or status >= 500


class Poster(Protocol):
    """Sends one chat request body and returns the reply's JSON (OpenAI's shape)."""

    async def post(self, body: dict[str, Any]) -> Any: ...

    async def close(self) -> None: ...


class _MalformedReply(Exception):
    """A 200 reply without usable choices."""


class RemoteChatModel(Model):
    """A chat model behind a network API: the concurrency cap, rate limits, retries and
    private event loop that `OpenAIModel` and `LiteLLMModel` share.

    Subclasses make the poster (`_new_poster`) that sends one request and returns the
    reply as an OpenAI-shaped dict, raising the OpenAI SDK's error classes.

    Args:
        model: the model name.
        max_concurrency: requests in flight at once, never more.
        requests_per_minute / tokens_per_minute: optional rate limits (tokens are
            estimated before a request and corrected from the reply's usage).
        timeout: seconds per request before it counts as failed and is retried.
        max_retries: retries of a 5xx, timeout, connection error or malformed reply,
            with exponential backoff and jitter. A connection that cannot be made at all
            (refused, unknown host, TLS failure) is retried at most `CONNECT_RETRIES`
            times within a few seconds, then raises `ConnectionFailedError` naming the URL.
        rate_limit_patience: seconds a request keeps retrying 429s (rate limited) before
            it gives up; these retries wait what Retry-After asks plus a random share
            of it, so refused requests do not all come back at once, and do not count
            against `max_retries`.
        cache, budget, prices: see `Model`.

    Requests run on the caller's event loop, with a connection pool for each loop that
    calls (closed when that loop ends), so the model works across repeated `asyncio.run`
    calls and inside Jupyter; `max_concurrency` holds across all of them. A model with
    rate limits, or whose client cannot share loops (`_requests_on_caller_loop`), sends
    its requests from a private event loop in a daemon thread instead, where the limits
    live. Call `close()` (or `await aclose()`) when done; it also closes at exit.
    """

    reports_sending = True  # a request waiting for its slot or rate limit is not sent yet

    def __init__(
        self,
        model: str,
        *,
        max_concurrency: int = 16,
        requests_per_minute: int | None = None,
        tokens_per_minute: int | None = None,
        timeout: float = 60.0,
        max_retries: int = 5,
        rate_limit_patience: float = 300.0,
        cache: Any = None,
        budget: Any = None,
        prices: Any = None,
    ) -> None:
        super().__init__(model, cache=cache, budget=budget, prices=prices)
        if max_concurrency < 1:
            raise OptoValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if max_retries < 0:
            raise OptoValueError(f"max_retries must be >= 0, got {max_retries}")
        if timeout <= 0:
            raise OptoValueError(f"timeout must be > 0 seconds, got {timeout}")
        if rate_limit_patience < 0:
            raise OptoValueError(f"rate_limit_patience must be >= 0 seconds, got {rate_limit_patience}")
        self.max_concurrency = max_concurrency
        self.timeout = timeout
        self.max_retries = max_retries
        self.rate_limit_patience = rate_limit_patience
        self._limits = RateLimiter(requests_per_minute, tokens_per_minute)
        # Formats this server rejected: json_schema falls back to json_object, then to none.
        self._rejected_formats: set[str] = set()
        self._start_clients()

    _thread_label = "remote"  # names the private loop's thread
    # How a user sets where requests go, named in the errors of a wrong or unreachable URL.
    _url_setting = ""
    # Whether requests may run on the caller's loop: True when each loop's poster holds
    # everything it uses (a subclass whose library shares clients between loops says False).
    _requests_on_caller_loop = True

    def _start_clients(self) -> None:
        """The private loop, the per-loop clients and the concurrency cap (none pickled)."""
        self._loop = BackgroundLoop(f"opto-{self._thread_label}-{self.name}")
        # Weakly: the finalizer holds the posters, and must not keep the model alive.
        self._posters: PerLoop[Poster] = PerLoop(_weakly(self._new_poster))
        self._gate = SharedSemaphore(self.max_concurrency)
        # Connection failures warn once until a request gets through again: every call in
        # a run retries them, and one line says it all (the rest go to DEBUG).
        self._connect_warned = False
        self._finalizer = weakref.finalize(self, _shut_down, self._loop, self._posters)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        for private in ("_loop", "_posters", "_gate", "_finalizer"):  # rebuilt where unpickled
            state.pop(private, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._start_clients()

    def __copy__(self) -> RemoteChatModel:
        """A copy in this process (what `switch_model` makes): its own loop, locks and
        clients, and the same key, which a pickle for another process never carries."""
        new = type(self).__new__(type(self))
        new.__setstate__(self.__getstate__())
        new._keep_secrets_of(self)
        return new

    def _keep_secrets_of(self, other: RemoteChatModel) -> None:
        """Take back what `__getstate__` leaves out for safety (a key): the copy stays here."""

    @abc.abstractmethod
    def _new_poster(self) -> Poster:
        """The object that sends requests (made on the loop that sends them, so its connections belong to it)."""

    def _request_url(self) -> str | None:
        """Where chat requests go, without credentials, for error messages (None: not known here)."""
        return None

    def _suggested_root(self) -> str | None:
        """A corrected API root to suggest when the server has no chat route at the URL (None: no guess)."""
        return None

    def _generate(  # not async: it returns the request's coroutine, one fewer for every call in flight
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
    ) -> Coroutine[Any, Any, Completion]:
        params: dict[str, Any] = {"model": self.name, "messages": messages}
        if stop is not None:
            params["stop"] = stop
        if logprobs:
            params["logprobs"] = True
        if tools is not None:
            params["tools"] = tools
        if tool_choice is not None:
            params["tool_choice"] = tool_choice
        if temperature is not None:
            params["temperature"] = temperature
        if max_tokens is not None:
            params["max_tokens"] = max_tokens
        if n != 1:
            params["n"] = n
        if seed is not None:
            params["seed"] = seed
        if response_format is not None:
            params["response_format"] = response_format
        if self._requests_on_caller_loop and not self._limits.limited:
            return self._request_with_retries(params)
        # The limits' buckets belong to one loop: requests wait for them on the private one.
        return self._loop.run(self._request_with_retries(params))

    async def _request_with_retries(self, params: dict[str, Any]) -> Completion:
        client = self._posters.get() or await self._posters.start()
        limited = self._limits.limited
        estimate = estimate_prompt_tokens(params["messages"]) if limited else 0  # for the token limit
        last_error: BaseException | None = None
        attempt = 0
        unreachable: str | None = None  # why the last attempt could not connect, if it could not
        unreachable_in_a_row = 0
        handle = None
        patience_ends = asyncio.get_running_loop().time() + self.rate_limit_patience
        while True:
            if handle is not None:  # a failed attempt's estimate leaves the token window: it was not served
                self._limits.record_actual(handle, 0)
                handle = None
            if self._rejected_formats:
                _downgrade_format(params, self._rejected_formats)
            delay: float | None = None
            try:
                async with self._gate:
                    # Inside the slot, so the rate limits count requests when they are sent.
                    if limited:
                        handle = await self._limits.acquire(estimate + params.get("max_tokens", 0))
                    request_sent()
                    reply = await client.post(params)
                completion = self._to_completion(reply, params["messages"])
                if handle is not None:
                    self._limits.record_actual(handle, completion.usage.total_tokens)
                if self._connect_warned:  # the server is back: the next outage warns again
                    self._connect_warned = False
                return completion
            except openai.APIStatusError as exc:
                kind = (params.get("response_format") or {}).get("type")
                # Servers reject a schema or JSON mode with a 400, some (llama-cpp-python's)
                # with a 500: step down. A request sent before a concurrent one recorded the
                # rejection steps down too.
                if kind and exc.status_code in (400, 500) and _about_response_format(exc):
                    if kind not in self._rejected_formats:
                        logger.warning(
                            "%s rejected response_format %r (%s); retrying with less",
                            self.name,
                            kind,
                            redact(exc.message),
                        )
                        self._rejected_formats.add(kind)
                    continue
                if exc.status_code == 404:
                    raise self._not_found_error(exc) from _keyless(exc)
                if not _is_transient_status(exc.status_code) or _quota_used_up(exc):
                    # A used-up quota is a 429 that waiting does not cure.
                    raise refused_request_error(
                        exc.status_code,
                        f"{self.name}: request rejected: {redact(exc.message)}",
                        codes=_error_codes(exc),
                        **_details_of(exc, self.name),
                    ) from _keyless(exc)
                last_error, unreachable, unreachable_in_a_row = exc, None, 0  # the server answered
                request_refused()  # an error status is not billed: a cancel while waiting to retry pays nothing
                if exc.status_code == 429 and asyncio.get_running_loop().time() < patience_ends:
                    # Rate limited: wait as asked (with jitter), without using up a retry.
                    delay = retry_after_delay(retry_after_seconds(exc.response.headers), attempt)
                    logger.warning("%s: %s; rate limited, retrying in %.2fs", self.name, describe_error(exc), delay)
                    await asyncio.sleep(delay)
                    continue
                delay = retry_after_seconds(exc.response.headers)
            except (*_TRANSIENT, _MalformedReply) as exc:
                last_error, delay = exc, None
                unreachable = connect_failure(exc) if isinstance(exc, openai.APIConnectionError) else None
            attempt += 1
            unreachable_in_a_row = unreachable_in_a_row + 1 if unreachable else 0
            if unreachable:
                # Refused, unknown host, TLS: a wrong URL or a stopped server, which minutes
                # of backoff would not cure. A few quick tries ride out a restart.
                retries = min(self.max_retries, CONNECT_RETRIES)
                if unreachable_in_a_row > retries or attempt > self.max_retries:
                    break
                delay = backoff_delay(unreachable_in_a_row - 1, base=CONNECT_BACKOFF_BASE, cap=CONNECT_BACKOFF_CAP)
                self._log_connect_retry(unreachable, last_error, unreachable_in_a_row, retries, delay)
                await asyncio.sleep(delay)
                continue
            if attempt > self.max_retries:
                break
            delay = backoff_delay(attempt - 1) if delay is None else retry_after_delay(delay, attempt - 1)
            logger.warning(
                "%s: %s; retry %d/%d in %.2fs", self.name, describe_error(last_error), attempt, self.max_retries, delay
            )
            await asyncio.sleep(delay)
        self._limits.record_actual(handle, 0)
        message = f"{self.name}: gave up after {attempt} attempts: {describe_error(last_error)}"
        if unreachable:
            message = (
                f"{self.name}: could not connect to {self._request_url() or 'the server'} ({unreachable}); "
                f"gave up after {attempt} attempts: {describe_error(last_error)}. "
                f"Is the server running, and is the URL right?{self._setting_hint()}"
            )
        raise unavailable_error(
            message,
            attempt,
            status=getattr(last_error, "status_code", None),
            timed_out=isinstance(last_error, openai.APITimeoutError),
            unreachable=unreachable is not None,
            malformed=isinstance(
                last_error, (_MalformedReply, json.JSONDecodeError, openai.APIResponseValidationError)
            ),
            **_details_of(last_error, self.name),
        ) from _keyless(last_error)

    def _log_connect_retry(
        self, reason: str, error: BaseException | None, retry: int, retries: int, delay: float
    ) -> None:
        """One WARNING per outage (naming the URL), DEBUG for every other retry of it."""
        level = logging.DEBUG if self._connect_warned else logging.WARNING
        self._connect_warned = True
        if logger.isEnabledFor(level):
            logger.log(
                level,
                "%s: could not connect to %s (%s: %s); retry %d/%d in %.2fs",
                self.name,
                self._request_url() or "the server",
                reason,
                describe_error(error),
                retry,
                retries,
                delay,
            )

    def _setting_hint(self) -> str:
        return f" It is set by {self._url_setting}." if self._url_setting else ""

    def _not_found_error(self, exc: openai.APIStatusError) -> LLMRequestError:
        """A 404, as the error that says what was not found: the route (the URL is wrong,
        `EndpointNotFoundError`) or the model (`ModelNotFoundError`); both name the URL."""
        detail = redact(_body_text(exc) or exc.message)[:300]
        url = self._request_url()
        where = f"POST {url}" if url else "the server"
        kind = _what_was_not_found(exc, detail, self.name)
        suggestion = self._suggested_root() if kind != "model" else None
        try_root = f" Try {suggestion} as the base URL." if suggestion else ""
        if kind == "route":
            message = (
                f"{self.name}: {where} answered 404 ({detail}): the server has no chat completions "
                f"route there, so the URL is wrong.{try_root}{self._setting_hint()}"
            )
        elif kind == "model":
            message = f"{self.name}: request rejected: {detail} ({where} has no model named {self.name!r})"
        else:  # a 404 that names neither: the model, most often, but say where it came from
            message = (
                f"{self.name}: request rejected: {detail} (404 from {where}: no model named {self.name!r} "
                f"there, or not the right URL).{try_root}"
            )
        return refused_request_error(
            404,
            message,
            codes=_error_codes(exc),
            route_missing=kind == "route",
            **_details_of(exc, self.name),
        )

    def _to_completion(self, body: Any, messages: list[Message]) -> Completion:
        """The reply as a `Completion`; a prompt token count it does not give is estimated
        from `messages`. One pass over the choices: this runs for every call."""
        choices = body.get("choices") if isinstance(body, dict) else None
        if not choices or not isinstance(choices, list):
            raise _MalformedReply(f"reply has no choices: {str(body)[:200]}")
        texts: list[str] = []
        reasons: list[Any] = []
        calls: list[list[ToolCall]] = []
        sampled: list[list[dict[str, Any]]] = []
        for choice in choices:
            message = (choice.get("message") or {}) if isinstance(choice, dict) else None
            if not isinstance(message, dict):
                raise _MalformedReply(f"reply has a choice without a message object: {str(choice)[:200]}")
            texts.append(message.get("content") or "")
            reasons.append(choice.get("finish_reason"))
            calls.append(tool_calls_of(message) if message.get("tool_calls") else [])
            sampled.append(_token_logprobs(choice) if choice.get("logprobs") else [])
        usage = body.get("usage")
        if not isinstance(usage, dict):
            usage = {}
        source = f"{self.name}'s replies"
        prompt_tokens = reported_tokens(usage.get("prompt_tokens"), field="prompt_tokens", source=source)
        completion = reported_tokens(usage.get("completion_tokens"), field="completion_tokens", source=source)
        if prompt_tokens is None:  # a count missing or invalid is estimated, so a reply cannot make a call free
            prompt_tokens = estimate_prompt_tokens(messages)
        if completion is None:
            completion = sum(map(estimate_tokens, texts))
        return Completion.__pydantic_validator__.validate_python(  # from a dict, the usage too: cheaper than keywords
            {
                "texts": texts,
                "finish_reason": "length" if "length" in reasons else (reasons[0] or "stop"),
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion},
                "model": body.get("model") or self.name,
                "sample_tool_calls": calls if any(calls) else [],
                "sample_logprobs": sampled if any(sampled) else [],
            }
        )

    async def aclose(self) -> None:
        """Close the HTTP clients and stop the private loop (this loop's client is closed
        when this returns; another running loop's is closed on that loop)."""
        await self._posters.close_here()
        await asyncio.to_thread(_shut_down, self._loop, self._posters)

    def close(self) -> None:
        """Close the HTTP clients and stop the private loop (the model can still be used: both restart)."""
        _shut_down(self._loop, self._posters)


def _shut_down(loop: BackgroundLoop, posters: PerLoop[Poster]) -> None:
    """Close the private loop's client there and stop that loop; every other loop closes
    its own client (also when the model is collected)."""
    if loop.running:
        posters.close_on(loop.loop, timeout=10)
    posters.drop_all()
    loop.stop()


def _weakly(method: Callable[[], Poster]) -> Callable[[], Poster]:
    """`method`, without a reference to its object."""
    ref = weakref.WeakMethod(method)

    def call() -> Poster:
        bound = ref()
        if bound is None:  # pragma: no cover - the model is gone, so nobody asks
            raise UsageError("the model was collected")
        return bound()

    return call


def _downgrade_format(params: dict[str, Any], rejected: set[str]) -> None:
    """Replace a response_format the server rejected by the next weaker one."""
    kind = (params.get("response_format") or {}).get("type")
    if kind == "json_schema" and kind in rejected:
        params["response_format"] = {"type": "json_object"}
        kind = "json_object"
    if kind is not None and kind in rejected:
        params.pop("response_format")


_FORMAT_WORDS = ("response_format", "json_schema", "json_object", "json mode", "structured output")


def _about_response_format(exc: openai.APIStatusError) -> bool:
    """Whether an error is about the response format (not, say, a prompt over the context length)."""
    text = f"{exc.param or ''} {exc.message}".lower()
    return any(word in text for word in _FORMAT_WORDS)


_CONNECT_ERRNOS = {
    errno.ECONNREFUSED: "connection refused",
    errno.EHOSTUNREACH: "host unreachable",
    errno.ENETUNREACH: "network unreachable",
    errno.EADDRNOTAVAIL: "address not available",
}


def connect_failure(error: BaseException) -> str | None:
    """Why no connection could be made at all ("connection refused", "unknown host", "TLS
    error", ...), from the error or the ones it was raised from; None for other failures
    (a timeout, or a connection that broke after it was made, which keep the long backoff)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (openai.APITimeoutError, TimeoutError)):
            return None
        if isinstance(current, socket.gaierror):  # aiohttp's DNS error is raised from it
            return "unknown host"
        if isinstance(current, (ssl.SSLError, ssl.CertificateError, aiohttp.ClientSSLError)):
            return "TLS error"
        if isinstance(current, OSError) and current.errno in _CONNECT_ERRNOS:  # aiohttp's errors carry it too
            return _CONNECT_ERRNOS[current.errno]
        # `raise ... from None` (as ChatPoster does) still keeps the original as the context.
        current = current.__cause__ or current.__context__
    return None


def public_url(url: str) -> str:
    """`url` fit for a message: without a user or password, query or fragment (where keys
    may be), and with any known key redacted."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:  # a malformed port: keep the host alone
        port = None
    netloc = f"{host}:{port}" if port is not None else host
    return redact(urlunsplit((parts.scheme, netloc, parts.path, "", "")))


# What servers answer for a path they do not serve (not for a model they do not have):
# opto's fake server, OpenAI, Go (Ollama), Express, LM Studio, FastAPI (vLLM), nginx.
_NO_ROUTE = re.compile(
    r"unknown route|invalid url|no route|route not found|page not found|cannot (?:post|get) /|"
    r"unexpected endpoint|unknown (?:endpoint|path|url)|no such (?:endpoint|route|path)|^\s*not found\s*$|<html",
    re.I,
)
_ABOUT_MODEL = re.compile(r"\bmodels?\b", re.I)


def _body_text(exc: openai.APIStatusError) -> str:
    """The error body's message (or the whole body, when it has none) as text."""
    body = exc.body
    if isinstance(body, dict):
        found = body.get("message") or body.get("detail") or body.get("error")
        return found if isinstance(found, str) else json.dumps(body, default=str)
    return body.strip() if isinstance(body, str) else ""


def _what_was_not_found(exc: openai.APIStatusError, detail: str, model: str) -> str:
    """What a 404's code and body say was not found: "model", "route" or "unclear"."""
    if "model_not_found" in _error_codes(exc):
        return "model"
    if _NO_ROUTE.search(detail):
        return "route"
    if _ABOUT_MODEL.search(detail) or re.search(rf"(?<![\w.-]){re.escape(model)}(?![\w.-])", detail):
        return "model"
    body = exc.body
    if isinstance(body, str) or (isinstance(body, dict) and not isinstance(body.get("message"), str)):
        return "route"  # not an OpenAI-style error: a web server's own 404, not the API's
    return "unclear"  # an API error that names nothing (or no body: LiteLLM keeps none)


def _error_codes(exc: openai.APIStatusError) -> tuple[Any, ...]:
    """The error's code and type (the SDK puts the code on the exception; LiteLLM keeps it
    in the error body)."""
    body = exc.body if isinstance(exc.body, dict) else {}
    body = body.get("error", body) if isinstance(body.get("error"), dict) else body
    return getattr(exc, "code", None), body.get("code"), body.get("type")


def _quota_used_up(exc: openai.APIStatusError) -> bool:
    """A 429 that says the account's quota is used up."""
    return "insufficient_quota" in _error_codes(exc)


def _details_of(error: BaseException | None, model: str) -> dict[str, Any]:
    """What an `LLMError` carries about the failed request: model, request id, retry-after."""
    headers = getattr(getattr(error, "response", None), "headers", None)
    return {
        "model": model,
        "request_id": getattr(error, "request_id", None),
        "retry_after": retry_after_seconds(headers) if headers is not None else None,
    }


def _keyless(error: BaseException | None) -> BaseException | None:
    """The error to chain as the cause, unless its text holds a key (then none: a
    traceback printed later must not show it)."""
    if error is None:
        return None
    text = f"{error} {getattr(error, 'message', '')} {getattr(error, 'body', '')}"
    return None if redact(text) != text else error


def _token_logprobs(choice: dict[str, Any]) -> list[dict[str, Any]]:
    """A choice's `logprobs.content` (one {"token", "logprob", ...} per token), or []."""
    found = choice.get("logprobs")
    content = found.get("content") if isinstance(found, dict) else None
    return [dict(t) for t in content if isinstance(t, dict)] if isinstance(content, list) else []
