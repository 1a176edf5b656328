"""Request-rate and token-rate limits for one model (run inside its event loop)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

from aiolimiter import AsyncLimiter

from ..errors import OptoValueError
from .shared_limits import Link, current_hub

__all__ = ["RateLimiter"]

_WINDOW = 60.0


class _TokenWindow:
    """Sliding one-minute window of tokens sent; a request waits until its tokens fit."""

    def __init__(self, tokens_per_minute: int) -> None:
        self.limit = tokens_per_minute
        self._entries: deque[list[float]] = deque()  # [timestamp, tokens]

    def _used(self, now: float) -> float:
        while self._entries and now - self._entries[0][0] >= _WINDOW:
            self._entries.popleft()
        return sum(tokens for _, tokens in self._entries)

    async def acquire(self, tokens: int) -> list[float]:
        while True:
            now = time.monotonic()
            # A request larger than the whole limit goes alone rather than never.
            if self._used(now) + tokens <= self.limit or not self._entries:
                entry = [now, float(tokens)]
                self._entries.append(entry)
                return entry
            await asyncio.sleep(max(0.01, _WINDOW - (now - self._entries[0][0])))

    @staticmethod
    def correct(entry: list[float], actual_tokens: int) -> None:
        """Replace the estimate with what the reply says was used."""
        entry[1] = float(actual_tokens)


class RateLimiter:
    """Requests per minute (aiolimiter's leaky bucket) and tokens per minute, both optional.

    Requests are spread evenly over the minute, with bursts of at most half a
    second's worth: a limit of 300 per minute sends about 5 requests a second, never the whole
    minute's quota at once (which a server that counts per second would refuse).

    On a `RayExecutor` the limits are held by the run's coordinator while rollouts run,
    so the limit holds for all worker processes together, not for each.
    """

    def __init__(self, requests_per_minute: int | None, tokens_per_minute: int | None) -> None:
        for label, value in (("requests_per_minute", requests_per_minute), ("tokens_per_minute", tokens_per_minute)):
            if value is not None and value < 1:
                raise OptoValueError(f"{label} must be >= 1 or None, got {value}")
        self.requests_per_minute = requests_per_minute
        self.tokens_per_minute = tokens_per_minute
        self.limited = bool(requests_per_minute or tokens_per_minute)  # whether a request may have to wait
        # Set while a coordinator holds these limits for several processes.
        self._link: Link | None = None
        self._key: str | None = None
        self._requests: AsyncLimiter | None = None
        if requests_per_minute:
            # Half a second's worth: a server counting per second keeps half its allowance
            # as slack for requests that the network delivers closer together than sent.
            burst = max(1.0, requests_per_minute / 120.0)
            self._requests = AsyncLimiter(burst, burst * _WINDOW / requests_per_minute)
        self._tokens = _TokenWindow(tokens_per_minute) if tokens_per_minute else None

    async def acquire(self, estimated_tokens: int) -> Any:
        """Wait for a free slot; returns a handle for `record_actual`."""
        if self._link is not None:
            return await self._link.acall("acquire", self._key, estimated_tokens)
        if self._requests is not None:
            await self._requests.acquire()
        if self._tokens is not None:
            return await self._tokens.acquire(estimated_tokens)
        return None

    def record_actual(self, handle: Any, tokens: int) -> None:
        if handle is None:
            return
        if self._link is not None and isinstance(handle, int):  # a coordinator's (one made before attaching is local)
            self._link.send("record_actual", self._key, handle, tokens)
        else:
            _TokenWindow.correct(handle, tokens)

    def attach(self, link: Link, key: str) -> None:
        """Let a coordinator (which holds a copy of these limits) decide when requests go."""
        self._link, self._key = link, key

    def detach(self) -> None:
        self._link = self._key = None

    def __getstate__(self) -> dict[str, Any]:
        if self._link is None and self.limited and (hub := current_hub()) is not None:
            hub.attach_limiter(self)
        return {
            "requests_per_minute": self.requests_per_minute,
            "tokens_per_minute": self.tokens_per_minute,
            "link": self._link,
            "key": self._key,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["requests_per_minute"], state["tokens_per_minute"])  # type: ignore[misc]
        self._link, self._key = state["link"], state["key"]
