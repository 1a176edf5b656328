"""`RemoteExecutor`: rollouts in other processes, decided and recorded by the driver.

The driver ships the agent once per `run`, submits one task per example (at most
`max_in_flight` at once), and awaits each result as it comes: never a blocking wait in
the event loop. Only the driver calls `on_result` and builds the `Rollout`s, so the
ledger is written by one process, once per rollout, exactly as with `AsyncioExecutor`.

A task whose worker or node died is submitted again (up to `max_attempts`, each lost
attempt logged); one past `timeout` seconds is cancelled by force (its worker is
killed) and recorded as a timeout failure. Where the tasks run is a `Backend`: Ray
(`RayExecutor`), or the in-process fake cluster of `opto.testing`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .._util.async_tools import gather_all
from ..core.agent import Agent
from ..core.data import Example
from ..core.guides import Guide
from ..core.parameters import ParameterValues
from ..core.rollout import Rollout, admit_rollouts, rollout_done, timeout_fields
from ..errors import OptoError, OptoValueError
from ..llm.errors import BudgetExceeded
from ..llm.sampling import current_sampling
from ..llm.shared_limits import Link
from ..llm.usage import UsageStats, add_to_meters, run_budgets
from .coordinator import CoordinatorHub
from .shipping import Shipment, ship, values_by_name
from .worker import RolloutTask

__all__ = ["Backend", "RemoteExecutor", "WorkerError", "WorkerLost"]

logger = logging.getLogger(__name__)


class WorkerLost(OptoError):
    """The process or node running a task died; the task may be submitted again."""


class WorkerError(OptoError, RuntimeError):
    """A worker could not run a task at all (not the agent failing: that is a failed rollout)."""


class Backend(Protocol):
    """Where `RemoteExecutor`'s tasks run."""

    def capacity(self) -> int:
        """Tasks that can run at once (the default cap on tasks in flight)."""
        ...

    def link(self) -> Link:
        """The run's coordinator (made on first use)."""
        ...

    def put(self, shipment: Shipment) -> Any:
        """Store a shipment where workers can fetch it; returns what `submit` passes on."""
        ...

    def submit(self, stored: Any, task: RolloutTask) -> Any:
        """Start a task; returns a handle."""
        ...

    async def result(self, handle: Any) -> dict[str, Any]:
        """The task's result; raises `WorkerLost` when its worker died, `WorkerError`
        when it could not run."""
        ...

    def cancel(self, handle: Any) -> None:
        """Stop a task now, killing its worker if it must."""
        ...


class RemoteExecutor:
    """A `RolloutExecutor` whose rollouts run on a `Backend`.

    Args:
        backend: where tasks run.
        max_in_flight: tasks submitted at once (default: the backend's capacity).
        max_attempts: tries of a rollout whose worker or node died (>= 1).
        timeout: seconds per rollout (None: no limit); `run(timeout=)` overrides it.
        grace: seconds past `timeout` before the driver stops a rollout by force. The
            worker's own timeout stops an async agent in time and keeps its trace; the
            driver's comes later and kills a worker stuck in code that cannot be interrupted.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        max_in_flight: int | None = None,
        max_attempts: int = 3,
        timeout: float | None = None,
        grace: float = 2.0,
    ) -> None:
        if max_in_flight is not None and max_in_flight < 1:
            raise OptoValueError(f"max_in_flight must be >= 1 or None, got {max_in_flight}")
        if max_attempts < 1:
            raise OptoValueError(f"max_attempts must be >= 1, got {max_attempts}")
        if timeout is not None and timeout <= 0:
            raise OptoValueError(f"timeout must be > 0 seconds or None, got {timeout}")
        self.backend = backend
        self.max_in_flight = max_in_flight
        self.max_attempts = max_attempts
        self.timeout = timeout
        self.grace = grace
        self._hub: CoordinatorHub | None = None

    @property
    def hub(self) -> CoordinatorHub:
        if self._hub is None:
            self._hub = CoordinatorHub(self.backend.link)  # the coordinator starts with the first budget or limit
        return self._hub

    async def run(
        self,
        agent: Agent,
        guide: Guide,
        examples: Sequence[Example],
        *,
        values: ParameterValues | None = None,
        min_score: float | None = None,
        timeout: float | None = None,
        on_result: Callable[[Rollout], None] | None = None,
    ) -> list[Rollout]:
        """Run agent and guide on every example in worker processes; results in input order."""
        if not examples:
            return []
        admit_rollouts(len(examples))  # a metric-call limit holds here as in this process
        timeout = timeout if timeout is not None else self.timeout
        agent.parameters()  # names every parameter: values travel by name
        hub = self.hub
        hub.hold()
        try:
            shipment = ship(agent, guide, hub, run_budgets())  # raises ShippingError before any task starts
            stored = self.backend.put(shipment)
            template = RolloutTask(
                digest=shipment.digest,
                example=examples[0],
                values=values_by_name(values),
                min_score=min_score,
                timeout=timeout,
                sampling=current_sampling(),
            )
            gate = asyncio.Semaphore(self.max_in_flight or max(1, self.backend.capacity()))

            async def one(example: Example) -> Rollout:
                async with gate:
                    task = dataclasses.replace(template, example=example)
                    rollout = await self._attempts(stored, task)
                rollout_done()
                if on_result is not None:
                    on_result(rollout)
                return rollout

            return await gather_all(one(example) for example in examples)
        finally:
            hub.release()

    async def _attempts(self, stored: Any, task: RolloutTask) -> Rollout:
        """One rollout: submitted again while its worker dies, up to `max_attempts`."""
        example_id = task.example.id or ""
        for attempt in range(1, self.max_attempts + 1):
            handle = self.backend.submit(stored, task)
            try:
                if task.timeout is None:
                    result = await self.backend.result(handle)
                else:
                    result = await asyncio.wait_for(self.backend.result(handle), task.timeout + self.grace)
            except TimeoutError:
                self.backend.cancel(handle)
                logger.warning(
                    "rollout on %s ran past rollout_timeout=%g s; its worker was stopped", example_id, task.timeout
                )
                return Rollout(
                    example_id=example_id,
                    x=task.example.x,
                    info=task.example.info,
                    **timeout_fields(task.timeout, task.min_score),
                )
            except WorkerLost as exc:
                logger.warning(
                    "rollout on %s: attempt %d/%d lost its worker (%s)%s",
                    example_id,
                    attempt,
                    self.max_attempts,
                    exc,
                    "; submitting it again" if attempt < self.max_attempts else "",
                )
                if attempt == self.max_attempts:
                    error = f"worker lost: {exc} (tried {attempt} times)"
                    return Rollout(
                        example_id=example_id,
                        x=task.example.x,
                        info=task.example.info,
                        score=task.min_score,
                        feedback=f"The rollout could not finish: {error}",
                        error=error,
                    )
                continue
            except BaseException:
                self.backend.cancel(handle)  # the run stops (budget, a failure elsewhere): free the worker
                raise
            return self._accept(result, example_id)
        raise AssertionError("unreachable")

    @staticmethod
    def _accept(result: dict[str, Any], example_id: str) -> Rollout:
        """The driver's side of a finished task: usage counted, logs passed on, the rollout built."""
        add_to_meters({name: UsageStats(**stats) for name, stats in result.get("usage", {}).items()})
        for record in result.get("logs", []):
            logging.getLogger(record["name"]).log(
                record["level"], "(worker pid %s, rollout on %s) %s", result.get("pid"), example_id, record["message"]
            )
        if "budget_exceeded" in result:
            raise BudgetExceeded(result["budget_exceeded"])
        return Rollout(**result["rollout"])

    def close(self) -> None:
        """Stop what the backend started for this executor (its coordinator, its actors)."""
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()
