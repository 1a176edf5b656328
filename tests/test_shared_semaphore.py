"""The model's concurrency cap: one `SharedSemaphore` for tasks of every loop and thread."""

from __future__ import annotations

import asyncio
import threading

from opto.llm._gate import SharedSemaphore


async def test_at_most_value_holders_and_first_come_first_served() -> None:
    gate = SharedSemaphore(2)
    holding, peak, order = 0, 0, []

    async def hold(i: int) -> None:
        nonlocal holding, peak
        async with gate:
            order.append(i)
            holding += 1
            peak = max(peak, holding)
            await asyncio.sleep(0.01)
            holding -= 1

    await asyncio.gather(*(hold(i) for i in range(10)))
    assert peak == 2 and order == list(range(10))


async def test_a_cancelled_waiter_gives_its_place_up_and_loses_no_slot() -> None:
    gate = SharedSemaphore(1)
    await gate.acquire()
    waiter = asyncio.create_task(gate.acquire())
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    gate.release()
    await asyncio.wait_for(gate.acquire(), 1)  # the slot came back


async def test_a_slot_handed_to_a_waiter_cancelled_meanwhile_is_passed_on() -> None:
    gate = SharedSemaphore(1)
    await gate.acquire()
    first = asyncio.create_task(gate.acquire())
    second = asyncio.create_task(gate.acquire())
    await asyncio.sleep(0)
    gate.release()  # handed to `first`, which is cancelled before it runs
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    await asyncio.wait_for(second, 1)
    assert first.cancelled() and second.done()


def test_waiters_on_other_threads_loops_are_woken_on_their_own_loops() -> None:
    gate = SharedSemaphore(1)
    ready, got = threading.Event(), []

    async def wait_elsewhere() -> None:
        ready.set()
        async with gate:
            got.append(threading.current_thread().name)

    async def main() -> None:
        await gate.acquire()
        thread = threading.Thread(target=lambda: asyncio.run(wait_elsewhere()), name="other")
        thread.start()
        ready.wait(5)
        await asyncio.sleep(0.05)
        assert got == []  # the other loop's task waits for the slot
        gate.release()
        await asyncio.to_thread(thread.join, 5)

    asyncio.run(main())
    assert got == ["other"]


def test_a_waiter_whose_loop_closed_is_skipped() -> None:
    gate = SharedSemaphore(1)
    asyncio.run(gate.acquire())
    dead = asyncio.new_event_loop()
    task = dead.create_task(gate.acquire())
    dead.run_until_complete(asyncio.sleep(0))  # the task now waits on `dead`
    dead.close()
    gate.release()  # no live waiter: the slot is free again
    asyncio.run(asyncio.wait_for(gate.acquire(), 1))
    del task
