"""A private event loop in a daemon thread.

`OpenAIModel` keeps its client, semaphore and rate limiters on one loop for its whole
life, so it can be called from any number of `asyncio.run` calls (each with a new
loop) or from Jupyter's loop, without "Event loop is closed" errors.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    def __init__(self, name: str) -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name=self._name, daemon=True)
                self._thread.start()
            return self._loop

    @property
    def running(self) -> bool:
        return self._loop is not None

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the private loop and await it from the caller's loop.

        Cancelling the caller cancels the coroutine on the private loop too.
        """
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return await asyncio.wrap_future(future)

    def run_sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        if not loop.is_running():
            loop.close()
