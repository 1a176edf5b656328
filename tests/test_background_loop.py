"""`BackgroundLoop`: coroutines handed to a private loop in batches, their outcomes handed
back; results, exceptions, cancellation and the caller's context all survive the trip."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from opto.llm._loop import BackgroundLoop

REQUEST = contextvars.ContextVar("request", default="none")


@pytest.fixture
def background():
    loop = BackgroundLoop("test-loop")
    yield loop
    loop.stop()


async def test_many_calls_return_their_own_results_and_run_on_the_private_thread(background):
    caller = threading.get_ident()

    async def job(i: int) -> tuple[int, int]:
        await asyncio.sleep(0.001 * (i % 5))
        return i, threading.get_ident()

    results = await asyncio.gather(*(background.run(job(i)) for i in range(300)))
    assert [i for i, _ in results] == list(range(300))
    assert {thread for _, thread in results} != {caller} and len({thread for _, thread in results}) == 1


async def test_an_exception_reaches_the_caller(background):
    async def fails() -> None:
        raise KeyError("from the private loop")

    with pytest.raises(KeyError, match="from the private loop"):
        await background.run(fails())


async def test_the_callers_context_travels_with_the_call(background):
    async def read() -> str:
        return REQUEST.get()

    async def as_request(name: str) -> str:
        REQUEST.set(name)
        return await background.run(read())

    assert await asyncio.gather(as_request("a"), as_request("b")) == ["a", "b"]


async def test_cancelling_the_caller_cancels_the_call_on_the_private_loop(background):
    started, cancelled = threading.Event(), threading.Event()

    async def slow() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    caller = asyncio.ensure_future(background.run(slow()))
    await asyncio.to_thread(started.wait, 5)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert await asyncio.to_thread(cancelled.wait, 5)


def test_calls_from_loops_that_come_and_go_each_get_their_answers(background):
    async def answer(i: int) -> int:
        return i * 2

    async def batch(offset: int) -> list[int]:
        return await asyncio.gather(*(background.run(answer(offset + i)) for i in range(50)))

    for offset in (0, 100, 200):  # a new loop per asyncio.run, the private one the same
        assert asyncio.run(batch(offset)) == [2 * (offset + i) for i in range(50)]
