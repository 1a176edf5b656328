"""One HTTP client per event loop, closed when its loop ends.

An aiohttp session belongs to the loop it was made on. Running requests on the caller's
loop (rather than handing each to a private loop in another thread, two thread switches
and two loops' work per call) needs a session for each loop that calls, closed before that
loop closes. The close rides on an async generator: a running loop tracks the async
generators started on it, and `asyncio.run` (like `asyncio.Runner`, pytest-asyncio and
`opto`'s sync entry points) closes them before it closes the loop; an async generator
that is dropped while its loop still runs is closed on that loop by the same hooks. So the
session is closed on its own loop, either way.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

__all__ = ["PerLoop"]


class _Closable(Protocol):
    async def close(self) -> None: ...


C = TypeVar("C", bound=_Closable)


@dataclass(eq=False)
class _Entry(Generic[C]):
    client: C
    closer: AsyncGenerator[None, None]


class PerLoop(Generic[C]):
    """`make()`'s client for each running loop that asks:
    `per_loop.get() or await per_loop.start()`."""

    def __init__(self, make: Callable[[], C]) -> None:
        self._make = make
        self._entries: dict[asyncio.AbstractEventLoop, _Entry[C]] = {}
        self._lock = threading.Lock()

    def get(self) -> C | None:
        """The running loop's client, if it has one (`start` makes it)."""
        entry = self._entries.get(asyncio.get_running_loop())
        return None if entry is None else entry.client

    async def start(self) -> C:
        """Make the running loop's client, closed when the loop ends."""
        loop = asyncio.get_running_loop()
        with self._lock:  # a loop closed without closing its async generators left its entry
            for gone in [other for other in self._entries if other.is_closed()]:
                del self._entries[gone]
        client = self._make()
        entry = _Entry(client, self._close_at_end(loop, client))
        await entry.closer.__anext__()  # started on this loop: the loop now closes it at its end
        with self._lock:
            self._entries[loop] = entry
        return client

    async def _close_at_end(self, loop: asyncio.AbstractEventLoop, client: C) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            with self._lock:
                entry = self._entries.get(loop)
                if entry is not None and entry.client is client:
                    del self._entries[loop]
            await client.close()

    async def close_here(self) -> None:
        """Close the running loop's client now."""
        with self._lock:
            entry = self._entries.pop(asyncio.get_running_loop(), None)
        if entry is not None:
            await entry.closer.aclose()

    def close_on(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        """Close `loop`'s client, waiting for it (`loop` runs in another thread)."""
        with self._lock:
            entry = self._entries.pop(loop, None)
        if entry is None or loop.is_closed():
            return
        closing = asyncio.run_coroutine_threadsafe(_aclose(entry.closer), loop)
        if loop is not asyncio._get_running_loop():  # on that loop itself, waiting would never end
            closing.result(timeout)

    def drop_all(self) -> None:
        """Let go of every client: each is closed on its own loop as that loop runs on
        (a closed loop already closed its own)."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


async def _aclose(closer: AsyncGenerator[None, None]) -> None:
    await closer.aclose()
