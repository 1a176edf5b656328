"""A semaphore that tasks of any event loop, in any thread, can share.

`asyncio.Semaphore` belongs to the loop that first waits on it. A model's requests run on
the loop of whoever calls it (each `asyncio.run` makes a new one, and a sync `train()`
inside Jupyter runs on a worker thread's), and `max_concurrency` must hold across all of
them, so the model's cap is this: a counter under a thread lock, whose waiters are futures
of their own loops, woken on their own loops.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Awaitable, Generator
from types import TracebackType

__all__ = ["SharedSemaphore"]


class SharedSemaphore:
    """At most `value` holders at once, first come first served, across loops and threads.

    Use as `async with gate:`. A released slot goes straight to the oldest waiter, so a
    newcomer cannot overtake it.
    """

    def __init__(self, value: int) -> None:
        self._free = value
        self._lock = threading.Lock()
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()

    def _try_acquire(self) -> bool:
        """Take a slot if one is free and nobody waits."""
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return True
        return False

    async def acquire(self) -> None:
        if not self._try_acquire():
            await self._wait()

    async def _wait(self) -> None:
        """Queue for a slot (or take one freed since `_try_acquire` looked)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return
            slot: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, slot))
        try:
            await slot
        except asyncio.CancelledError:
            with self._lock:
                try:
                    self._waiters.remove((loop, slot))
                    handed = False
                except ValueError:  # already handed over (maybe on its way): pass it on
                    handed = True
            if handed and slot.done() and not slot.cancelled():
                self.release()
            raise

    def release(self) -> None:
        while True:
            with self._lock:
                if not self._waiters:
                    self._free += 1
                    return
                loop, slot = self._waiters.popleft()
            if loop is asyncio._get_running_loop():
                self._hand_over(slot)
                return
            try:
                loop.call_soon_threadsafe(self._hand_over, slot)
                return
            except RuntimeError:  # that loop is closed: nobody waits there any more
                continue

    def _hand_over(self, slot: asyncio.Future[None]) -> None:
        """On the waiter's loop: give it the slot, or pass the slot on if it stopped waiting."""
        if slot.done():
            self.release()
        else:
            slot.set_result(None)

    # `async with gate` on every model call: entering with a free slot and leaving make no
    # coroutine (each would be one more object per request in flight), only a wait does.
    def __aenter__(self) -> Awaitable[None]:
        return _DONE if self._try_acquire() else self._wait()

    def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> Awaitable[None]:
        self.release()
        return _DONE


class _Done:
    """An awaitable that is already done: awaiting it gives None at once."""

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        return iter(())  # type: ignore[return-value]  # an empty iterator: finished before it starts


_DONE = _Done()
