"""`POST /chat/completions` on aiohttp directly, with the OpenAI SDK's headers and errors.

The SDK's generic `post` builds an httpx request for every call (URL parsing, header
merging, option models): over half a millisecond of CPU, more than the rest of a
training step spends per call. So the hot path posts the JSON itself. The SDK client
still provides the headers (key, organization, project, user agent; not its
X-Stainless-* telemetry, which servers do not need and every request would carry) and
turns an error response into its exception classes, so retries and error messages stay
the same.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httpx2
import openai

__all__ = ["ChatPoster"]


class ChatPoster:
    """Sends chat completion requests for one `openai.AsyncOpenAI` client, on one loop.

    Args:
        client: supplies the URL, the headers and the error classes.
        timeout: seconds for a whole request.
    """

    def __init__(self, client: openai.AsyncOpenAI, timeout: float) -> None:
        self.client = client
        self._url = str(client.base_url).rstrip("/") + "/chat/completions"
        headers = {**client.default_headers, **client.auth_headers}
        self._headers = {
            k: v
            for k, v in headers.items()
            if isinstance(v, str)  # the SDK marks unset ones Omit
            and not k.lower().startswith("x-stainless-")  # its own telemetry: not needed
        }
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._proxy = _env_proxy(self._url)
        self._session: aiohttp.ClientSession | None = None

    async def post(self, body: dict[str, Any]) -> Any:
        """The reply's JSON; raises the SDK's `APIStatusError` subclasses for error statuses,
        `APITimeoutError`, `APIConnectionError`, and `json.JSONDecodeError` for a broken body."""
        if self._session is None:
            # limit=0: the model's semaphore bounds the requests in flight, not the pool. The
            # headers are the session's: given to each request, aiohttp would merge them anew.
            self._session = aiohttp.ClientSession(
                headers=self._headers, timeout=self._timeout, connector=aiohttp.TCPConnector(limit=0)
            )
        try:
            # Awaited, not `async with`: aiohttp's context manager adds a coroutine that lives
            # as long as the request, and three more to leave it.
            response = await self._session.post(self._url, json=body, proxy=self._proxy)
            try:
                content = await response.read()
                status = response.status
            finally:
                response.release()  # the connection goes back to the pool
        except asyncio.TimeoutError:
            raise openai.APITimeoutError(request=self._request()) from None
        except aiohttp.ClientError as exc:
            # `from None` keeps tracebacks short; aiohttp's error stays the context, where
            # `remote.connect_failure` tells a refused connection from one that broke.
            raise openai.APIConnectionError(message=f"Connection error: {exc}", request=self._request()) from None
        if status >= 400:
            headers = list(response.headers.items())
            error = httpx2.Response(status, headers=headers, content=content, request=self._request())
            raise self.client._make_status_error_from_response(error)
        return _json_of(content)

    def _request(self) -> httpx2.Request:
        return httpx2.Request("POST", self._url)

    async def close(self) -> None:
        """Close this loop's connections (the SDK client sent nothing: it has none)."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


def _json_of(content: bytes) -> Any:
    """The reply's JSON. Decoded as UTF-8 first (what JSON over HTTP is), so `json.loads`
    need not detect the encoding on every reply; another encoding is detected."""
    try:
        text = content.decode()
    except UnicodeDecodeError:
        return json.loads(content)
    return json.loads(text[1:] if text.startswith("\ufeff") else text)  # a UTF-8 byte order mark


def _env_proxy(url: str) -> str | None:
    """The proxy the environment (HTTPS_PROXY, NO_PROXY, ...) sets for `url`, looked up once:
    aiohttp's trust_env would read the environment again on every request."""
    parts = urlsplit(url)
    if urllib.request.proxy_bypass_environment(parts.hostname or ""):  # type: ignore[attr-defined]  # public, unstubbed
        return None
    return urllib.request.getproxies_environment().get(parts.scheme)
