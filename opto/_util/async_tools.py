"""Async helpers: sync entry points that also work inside a running loop, and gather."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
from collections.abc import Awaitable, Coroutine, Iterable
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["gather_all", "run_sync"]


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from sync code.

    Inside a running event loop (Jupyter), `asyncio.run` is not allowed, so the
    coroutine gets its own loop in a worker thread and this call waits for it.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    context = contextvars.copy_context()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="opto-sync") as pool:
        return pool.submit(context.run, asyncio.run, coro).result()


async def gather_all(aws: Iterable[Awaitable[T]]) -> list[T]:
    """Like `asyncio.gather`, but the first exception cancels the others before it propagates."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
