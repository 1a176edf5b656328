"""`FakeCluster`: a `RemoteExecutor` backend in this process, with failures on demand.

Tasks run the real worker code (`opto.executors.worker.execute`) on the real pickled
agent, each in a thread of its own with a fresh event loop and no context from the
driver, as in another process. `faults(example_id, attempt)` decides what happens to
an attempt: None runs it, "crash" loses its worker, "node" loses its node, "hang"
never answers (until cancelled). Tests of the executor's logic take milliseconds.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..errors import OptoValueError
from ..executors.coordinator import Coordinator
from ..executors.remote import WorkerError, WorkerLost
from ..executors.shipping import Shipment
from ..executors.worker import RolloutTask, execute, unload_all
from ..llm._loop import BackgroundLoop

__all__ = ["FakeCluster", "LocalLink"]

Fault = Callable[[str, int], str | None]

_COORDINATORS: dict[int, tuple[Coordinator, BackgroundLoop]] = {}
_NUMBERS = itertools.count(1)


class LocalLink:
    """A `Link` to a `Coordinator` in this process (pickles by number, as an actor handle would)."""

    def __init__(self, coordinator: Coordinator | None = None) -> None:
        self.number = next(_NUMBERS)
        _COORDINATORS[self.number] = (coordinator or Coordinator(), BackgroundLoop("opto-fake-coordinator"))
        self.calls = 0

    @property
    def coordinator(self) -> Coordinator:
        return _COORDINATORS[self.number][0]

    def _start(self, method: str, args: tuple[Any, ...]) -> tuple[Any, BackgroundLoop]:
        coordinator, loop = _COORDINATORS[self.number]
        self.calls += 1
        return getattr(coordinator, method)(*args), loop

    def call(self, method: str, *args: Any) -> Any:
        result, loop = self._start(method, args)  # async methods run on the coordinator's own loop
        return loop.run_sync(result) if asyncio.iscoroutine(result) else result

    async def acall(self, method: str, *args: Any) -> Any:
        result, loop = self._start(method, args)
        return await loop.run(result) if asyncio.iscoroutine(result) else result

    def send(self, method: str, *args: Any) -> None:
        self.call(method, *args)

    def __getstate__(self) -> dict[str, Any]:
        return {"number": self.number, "calls": 0}


class FakeCluster:
    """A backend whose `workers` run tasks in threads of this process.

    Counters for tests: `submitted` (tasks started, attempts included) and `cancelled`.
    """

    def __init__(self, workers: int = 2, faults: Fault | None = None) -> None:
        self.workers = workers
        self.faults = faults
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="opto-fake-worker")
        self._link: LocalLink | None = None
        self._attempts: dict[str, int] = {}
        self._lock = threading.Lock()
        self.submitted = 0
        self.cancelled = 0

    def capacity(self) -> int:
        return self.workers

    def link(self) -> LocalLink:
        if self._link is None:
            self._link = LocalLink()
        return self._link

    def put(self, shipment: Shipment) -> Shipment:
        return shipment

    def submit(self, stored: Shipment, task: RolloutTask) -> asyncio.Future[dict[str, Any]]:
        example_id = task.example.id or ""
        with self._lock:
            self.submitted += 1
            attempt = self._attempts[example_id] = self._attempts.get(example_id, 0) + 1
        fault = self.faults(example_id, attempt) if self.faults is not None else None
        loop = asyncio.get_running_loop()
        if fault == "hang":
            return loop.create_future()
        if fault in ("crash", "node"):
            future = loop.create_future()
            what = "the worker process died (SIGKILL)" if fault == "crash" else "the node running it died"
            future.set_exception(WorkerLost(what))
            return future
        if fault is not None:
            raise OptoValueError(f"unknown fault {fault!r}: use None, 'crash', 'node' or 'hang'")

        return loop.run_in_executor(self._pool, execute, stored.blob, task)

    async def result(self, handle: asyncio.Future[dict[str, Any]]) -> dict[str, Any]:
        try:
            return await asyncio.shield(handle)
        except (WorkerLost, asyncio.CancelledError):
            raise
        except Exception as exc:  # as Ray reports a task that raised
            raise WorkerError(f"a worker could not run the rollout: {exc!r}") from exc

    def cancel(self, handle: asyncio.Future[dict[str, Any]]) -> None:
        if not handle.done():
            with self._lock:
                self.cancelled += 1
            handle.cancel()

    def close(self) -> None:
        """Stop the worker threads and drop the agents they loaded (closing their models)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        unload_all()
