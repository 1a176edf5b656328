"""Running an agent and its guide on one example, with given parameter values."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ._async import gather_all
from ._io import json_key
from .agent import Agent
from .data import Example
from .errors import OptoValueError
from .guides import Guide
from .llm.errors import BudgetExceeded, describe_error
from .llm.tracing import record_llm_calls
from .llm.usage import meter_usage, run_budgets
from .parameters import ParameterValues, assign, track_reads

__all__ = [
    "AsyncioExecutor",
    "Rollout",
    "RolloutExecutor",
    "RolloutFields",
    "mean_score",
    "run_rollout",
    "run_rollouts",
    "timeout_fields",
    "values_digest",
]

logger = logging.getLogger(__name__)


class RolloutFields(BaseModel):
    """What one run of agent and guide produced (shared by `Rollout` and its ledger event)."""

    x: Any = None
    info: Any = None
    output: Any = None
    score: float | None = None
    feedback: str = ""
    trace: list[dict[str, Any]] = Field(default_factory=list)
    error: str | None = None
    # Which parameter values the agent ran under (a digest of its trainable values): rollouts
    # of one example with the same digest ran the same policy.
    values_hash: str | None = None
    # What the run of agent and guide used: paid tokens, their cost, and its wall time
    # (the "cost" and "latency" objectives of `selection="pareto"`).
    tokens: int | None = None
    cost_usd: float | None = None
    seconds: float | None = None


class Rollout(RolloutFields):
    """One run of the agent and the guide on one example.

    `error` is set when the agent or the guide raised; the score is then the trainer's
    `min_score` (None unless given) and the error is the feedback.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    example_id: str
    # Names of the parameters the agent read during this run (not written to the ledger).
    parameters_read: list[str] = Field(default_factory=list, exclude=True, repr=False)

    @property
    def failed(self) -> bool:
        return self.error is not None

    def to_record(self) -> dict[str, Any]:
        """The rollout as `RolloutEvent` fields (`instance_id` links it to proposals and candidates)."""
        record = self.model_dump(mode="json")
        record["instance_id"] = record.pop("example_id")
        return record


def mean_score(rollouts: Sequence[Rollout]) -> float | None:
    """Mean of the scores that exist; None when no rollout could be judged."""
    scores = [r.score for r in rollouts if r.score is not None]
    return float(np.mean(scores)) if scores else None


async def run_rollout(
    agent: Agent,
    guide: Guide,
    example: Example,
    *,
    values: ParameterValues | None = None,
    min_score: float | None = None,
    timeout: float | None = None,
) -> Rollout:
    """Run `agent` on `example` under `values` (none: the stored values) and judge it.

    Agent and guide exceptions become a failed rollout, and so does a run of agent and
    guide longer than `timeout` seconds (a sync agent's thread cannot be stopped: it
    finishes in the background, its result unused). `BudgetExceeded` propagates,
    because it means the run must stop, not that this example failed.
    """
    base = {"example_id": example.id or "", "x": example.x, "info": example.info}
    started = time.perf_counter()
    with assign(values or {}):
        base["values_hash"] = values_digest(agent)  # before tracking: the digest is not the agent's read
        with record_llm_calls() as trace, track_reads() as reads, meter_usage() as meter:
            if timeout is None:
                fields = await _agent_then_guide(agent, guide, example, min_score)
            else:
                try:
                    fields = await asyncio.wait_for(_agent_then_guide(agent, guide, example, min_score), timeout)
                except TimeoutError:
                    logger.debug("rollout on %s timed out after %s s", example.id, timeout)
                    fields = timeout_fields(timeout, min_score)
    for budget in run_budgets():  # calls seen after the fact (OpenTelemetry spans) used it up
        if budget.overrun is not None:
            raise BudgetExceeded(budget.overrun)
    used = meter.total
    return Rollout(
        **base,
        **fields,
        trace=list(trace),
        parameters_read=sorted(reads),
        tokens=used.total_tokens,
        cost_usd=used.cost_usd,
        seconds=round(time.perf_counter() - started, 6),
    )


def timeout_fields(timeout: float | None, min_score: float | None) -> dict[str, Any]:
    """A rollout's score, feedback and error when it ran past `timeout` seconds."""
    limit = f"rollout_timeout={timeout:g} s" if timeout is not None else "its rollout_timeout"
    error = f"timeout: the agent and guide took longer than {limit}"
    return {"score": min_score, "feedback": f"The run was stopped: {error}", "error": error}


def values_digest(agent: Agent) -> str:
    """A short digest of the trainable values `agent` sees now (assignments included)."""
    values = {p.name: p.current_value() for p in agent.parameters(trainable_only=True)}
    return hashlib.sha256(json_key(values).encode()).hexdigest()[:12]


async def _agent_then_guide(agent: Agent, guide: Guide, example: Example, min_score: float | None) -> dict[str, Any]:
    """The rollout's fields after running the agent, then the guide on its output."""
    try:
        output = await agent.arun(example.x)
    except BudgetExceeded:
        raise
    except Exception as exc:  # the agent's failure is data for the trainer
        logger.debug("agent failed on %s: %r", example.id, exc)
        problem = describe_error(exc)
        return {"score": min_score, "feedback": f"The agent raised {problem}", "error": f"agent: {problem}"}
    try:
        feedback = await guide.aget_feedback(example.x, output, example.info)
    except BudgetExceeded:
        raise
    except Exception as exc:
        logger.debug("guide failed on %s: %r", example.id, exc)
        problem = describe_error(exc)
        return {
            "output": output,
            "score": min_score,
            "feedback": f"The guide raised {problem}",
            "error": f"guide: {problem}",
        }
    return {"output": output, "score": feedback.score, "feedback": feedback.feedback}


async def run_rollouts(
    agent: Agent,
    guide: Guide,
    examples: Sequence[Example],
    *,
    values: ParameterValues | None = None,
    min_score: float | None = None,
    concurrency: int = 16,
    timeout: float | None = None,
    on_result: Callable[[Rollout], None] | None = None,
) -> list[Rollout]:
    """`run_rollout` on every example, at most `concurrency` at once, in input order;
    `on_result` is called with each rollout as it finishes (e.g. for a progress bar)."""
    if concurrency < 1:
        raise OptoValueError(f"concurrency must be >= 1, got {concurrency}")
    gate = asyncio.Semaphore(concurrency)

    async def one(example: Example) -> Rollout:
        async with gate:
            rollout = await run_rollout(agent, guide, example, values=values, min_score=min_score, timeout=timeout)
        if on_result is not None:
            on_result(rollout)
        return rollout

    return await gather_all(one(e) for e in examples)


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
