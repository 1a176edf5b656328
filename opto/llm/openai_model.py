"""`OpenAIModel`: OpenAI and any OpenAI-compatible chat completions server."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

import openai

from .._util.redaction import remember_secret
from ..errors import OptoValueError
from ._chat_http import ChatPoster
from .errors import AuthenticationError
from .remote import RemoteChatModel, public_url

__all__ = ["OpenAIModel"]

NO_KEY = "no-key-needed"  # sent to a custom base_url that needs no key
OPENAI_ROOT = "https://api.openai.com/v1"  # the SDK's root when no base_url is set
CHAT_ROUTE = "/chat/completions"


def resolve_credentials(base_url: str | None, api_key: str | None, who: str) -> tuple[str | None, str]:
    """The API root and key: arguments first, then OPENAI_BASE_URL / OPENAI_API_KEY.

    A custom base_url with no key gets a placeholder (local servers need none); OpenAI
    itself without a key is a clear error.
    """
    base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
    api_key = api_key or os.environ.get("OPENAI_API_KEY")
    if not api_key:
        if base_url is None:
            raise OptoValueError(
                f"{who} needs an API key: pass api_key=... or set OPENAI_API_KEY "
                "(or pass base_url=... for an OpenAI-compatible server that needs none)"
            )
        return base_url, NO_KEY  # a placeholder, not a secret: never redacted
    remember_secret(api_key)
    return base_url, api_key


class OpenAIModel(RemoteChatModel):
    """A chat model behind the OpenAI API or any server that speaks it.

    Args:
        model: the model name, e.g. "gpt-4o-mini".
        base_url: the API root; defaults to `OPENAI_BASE_URL`, then OpenAI itself.
        api_key: defaults to `OPENAI_API_KEY`; a placeholder is sent to a custom
            base_url when there is none (local servers need no key). Never logged.
        max_concurrency: requests in flight at once.
        requests_per_minute: a client-side request rate limit (None: none).
        tokens_per_minute: a client-side token rate limit (None: none).
        timeout: seconds one request may take.
        max_retries: retries of a failed request (429s within `rate_limit_patience` are not counted).
        rate_limit_patience: seconds to keep waiting out 429s before they count as failures.
        cache: a `ResponseCache` (None: no caching).
        budget: a `Budget` every call is checked against before it is sent.
        prices: {model name: {"input": usd_per_1m_tokens, "output": usd_per_1m_tokens}}, over
            the maintained price table's (see `Model`).

    Call `close()` (or `await aclose()`) when done; it also closes at exit.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
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
        self.base_url, self._api_key = resolve_credentials(base_url, api_key, "OpenAIModel")
        self._sdk: openai.AsyncOpenAI | None = None  # made once: it builds an SSL context (20 ms)
        super().__init__(
            model,
            max_concurrency=max_concurrency,
            requests_per_minute=requests_per_minute,
            tokens_per_minute=tokens_per_minute,
            timeout=timeout,
            max_retries=max_retries,
            rate_limit_patience=rate_limit_patience,
            cache=cache,
            budget=budget,
            prices=prices,
        )

    _thread_label = "openai"
    _url_setting = "base_url= (or the OPENAI_BASE_URL environment variable; --base-url for the opto command)"

    def __repr__(self) -> str:  # the key stays out of every repr and log line
        return f"OpenAIModel({self.name!r}, base_url={self.base_url!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        if state["_api_key"] != NO_KEY:  # a key never travels: the other process reads its own
            state["_api_key"] = None
        state["_sdk"] = None
        return state

    def _keep_secrets_of(self, other: RemoteChatModel) -> None:
        self._api_key = other._api_key  # type: ignore[attr-defined]

    def _request_url(self) -> str:
        """The chat completions URL (as `ChatPoster` builds it), without credentials or query."""
        return public_url(self.base_url or OPENAI_ROOT).rstrip("/") + CHAT_ROUTE

    def _suggested_root(self) -> str | None:
        """The base URL with `/v1` added (what OpenAI-compatible servers serve under), or
        without a `/chat/completions` given by mistake; None when it already ends in `/v1`."""
        root = public_url(self.base_url or OPENAI_ROOT).rstrip("/")
        path = urlsplit(root).path
        if path.endswith(CHAT_ROUTE):
            return root[: -len(CHAT_ROUTE)] or None
        return None if path.endswith("/v1") else root + "/v1"

    def _new_poster(self) -> ChatPoster:
        return ChatPoster(self._sdk_client(), self.timeout)

    def _sdk_client(self) -> openai.AsyncOpenAI:
        """The SDK client that gives every loop's poster its URL, headers and error classes
        (it sends nothing itself, so it holds no connection and one serves every loop)."""
        if self._sdk is not None:
            return self._sdk
        if self._api_key is None:  # unpickled in another process (a Ray worker)
            self._api_key = os.environ.get("OPENAI_API_KEY") or None
            if self._api_key is None:
                raise AuthenticationError(
                    "OpenAIModel has no API key in this process: keys are never sent with a shipped agent, so "
                    "each worker reads OPENAI_API_KEY from its own environment; set it there (the node's "
                    "environment, or ray.init(runtime_env={'env_vars': {...}}))"
                )
            remember_secret(self._api_key)
        self._sdk = openai.AsyncOpenAI(
            api_key=self._api_key, base_url=self.base_url, timeout=self.timeout, max_retries=0
        )
        return self._sdk
