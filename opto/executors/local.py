"""Where rollouts run: the `RolloutExecutor` protocol, and `AsyncioExecutor`, the default
that runs them as asyncio tasks in this process. `RemoteExecutor` and `RayExecutor`
(beside this module) implement the same protocol on other processes and machines."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from ..core.agent import Agent
from ..core.data import Example
from ..core.guides import Guide
from ..core.parameters import ParameterValues
from ..core.rollout import Rollout, run_rollouts
from ..errors import OptoValueError

__all__ = ["AsyncioExecutor", "RolloutExecutor"]


@runtime_checkable
class RolloutExecutor(Protocol):
    """Where rollouts run: every agent run of the trainer (training, validation, proposal
    scoring, evaluation) goes through one executor, so a distributed one can take over
    without touching the trainer. Results come back in input order."""

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
        """`run_rollout` on every example; `timeout` (seconds per rollout) overrides the
        executor's own; `on_result` is called with each rollout as it finishes."""
        ...


class AsyncioExecutor:
    """The default executor: rollouts as asyncio tasks in this process.

    Args:
        concurrency: rollouts at once, at most (per `run` call).
        timeout: seconds per rollout before it counts as failed (None: no limit).
    """

    def __init__(self, concurrency: int = 16, timeout: float | None = None) -> None:
        if concurrency < 1:
            raise OptoValueError(f"concurrency must be >= 1, got {concurrency}")
        self.concurrency = concurrency
        self.timeout = timeout

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
        return await run_rollouts(
            agent,
            guide,
            examples,
            values=values,
            min_score=min_score,
            concurrency=self.concurrency,
            timeout=timeout if timeout is not None else self.timeout,
            on_result=on_result,
        )
