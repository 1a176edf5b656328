"""A private event loop in a daemon thread.

`OpenAIModel` keeps its client, semaphore and rate limiters on one loop for its whole
life, so it can be called from any number of `asyncio.run` calls (each with a new
loop) or from Jupyter's loop, without "Event loop is closed" errors.

Hand-offs between the caller's loop and the private one are batched: a call queues its
coroutine and wakes the private loop only if no wake-up is pending, and results go back
the same way. With many calls in flight, one wake-up (a write to the loop's self-pipe and
a thread switch) serves many calls instead of two per call.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(eq=False)
class _Job:
    """One coroutine sent to the private loop, and where its outcome goes."""

    coro: Coroutine[Any, Any, Any]
    caller: asyncio.AbstractEventLoop
    done: asyncio.Future[Any]
    context: contextvars.Context
    task: asyncio.Task[Any] | None = None
    cancelled: bool = False


class BackgroundLoop:
    def __init__(self, name: str) -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # Jobs waiting for the private loop, and finished ones waiting for their caller's
        # loop. A non-empty inbox, or an outbox present, means a wake-up is already on its way.
        self._inbox: list[_Job] = []
        self._outboxes: dict[asyncio.AbstractEventLoop, list[_Job]] = {}
        self._mail_lock = threading.Lock()

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
        """Run `coro` on the private loop, in a copy of the caller's context, and await it
        from the caller's loop. Cancelling the caller cancels the coroutine too."""
        caller = asyncio.get_running_loop()
        job = _Job(coro, caller, caller.create_future(), contextvars.copy_context())
        loop = self.loop
        with self._mail_lock:
            wake = not self._inbox
            self._inbox.append(job)
        if wake:
            loop.call_soon_threadsafe(self._start_jobs)
        try:
            return await job.done
        except asyncio.CancelledError:
            with self._mail_lock:
                job.cancelled = True
                task = job.task
            if task is not None and not loop.is_closed():
                loop.call_soon_threadsafe(task.cancel)
            raise

    def _start_jobs(self) -> None:
        """On the private loop: start every queued job."""
        with self._mail_lock:
            jobs, self._inbox = self._inbox, []
        loop = asyncio.get_running_loop()
        for job in jobs:
            with self._mail_lock:
                if job.cancelled:
                    job.coro.close()
                    continue
                # A task copies the context current at its creation: the caller's.
                job.task = job.context.run(loop.create_task, job.coro)
            job.task.add_done_callback(functools.partial(self._finish, job))

    def _finish(self, job: _Job, _task: object = None) -> None:
        """On the private loop: hand a finished job back to its caller's loop."""
        with self._mail_lock:
            wake = job.caller not in self._outboxes
            self._outboxes.setdefault(job.caller, []).append(job)
        if wake:
            try:
                job.caller.call_soon_threadsafe(self._deliver, job.caller)
            except RuntimeError:  # the caller's loop is closed: nobody waits for these
                with self._mail_lock:
                    self._outboxes.pop(job.caller, None)

    def _deliver(self, caller: asyncio.AbstractEventLoop) -> None:
        """On the caller's loop: set the outcome of every job finished for it."""
        with self._mail_lock:
            finished = self._outboxes.pop(caller, [])
        for job in finished:
            task = job.task
            assert task is not None
            if job.done.done():  # the caller was cancelled meanwhile: the outcome is dropped, read
                if not task.cancelled():
                    task.exception()
                continue
            if task.cancelled():
                job.done.cancel()
            elif task.exception() is not None:
                job.done.set_exception(task.exception())  # type: ignore[arg-type]
            else:
                job.done.set_result(task.result())

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
