"""Running an agent and its guide on one example, with given parameter values."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ._async import gather_all
from .agent import Agent
from .data import Example
from .guides import Guide
from .llm.errors import BudgetExceeded
from .llm.tracing import record_llm_calls
from .parameters import Parameter, assign

__all__ = ["Rollout", "mean_score", "run_rollout", "run_rollouts"]

logger = logging.getLogger(__name__)


class Rollout(BaseModel):
    """One run of the agent and the guide on one example.

    `error` is set when the agent or the guide raised; the score is then the trainer's
    `min_score` (None unless given) and the error is the feedback.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    example_id: str
    x: Any
    info: Any = None
    output: Any = None
    score: float | None = None
    feedback: str = ""
    trace: list[dict[str, Any]] = Field(default_factory=list)
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    def to_record(self) -> dict[str, Any]:
        """The rollout as ledger fields (`instance_id` links it to proposals and candidates)."""
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
    values: Mapping[Parameter, Any] | None = None,
    min_score: float | None = None,
) -> Rollout:
    """Run `agent` on `example` under `values` (none: the stored values) and judge it.

    Agent and guide exceptions become a failed rollout; `BudgetExceeded` propagates,
    because it means the run must stop, not that this example failed.
    """
    base = {"example_id": example.id or "", "x": example.x, "info": example.info}
    with assign(values or {}), record_llm_calls() as trace:
        try:
            output = await agent.arun(example.x)
        except BudgetExceeded:
            raise
        except Exception as exc:  # the agent's failure is data for the trainer
            logger.debug("agent failed on %s: %r", example.id, exc)
            return Rollout(**base, score=min_score, feedback=f"The agent raised {_describe(exc)}",
                           trace=list(trace), error=f"agent: {_describe(exc)}")
    try:
        feedback = await guide.aget_feedback(example.x, output, example.info)
    except BudgetExceeded:
        raise
    except Exception as exc:
        logger.debug("guide failed on %s: %r", example.id, exc)
        return Rollout(**base, output=output, score=min_score, feedback=f"The guide raised {_describe(exc)}",
                       trace=list(trace), error=f"guide: {_describe(exc)}")
    return Rollout(**base, output=output, score=feedback.score, feedback=feedback.feedback, trace=list(trace))


async def run_rollouts(
    agent: Agent,
    guide: Guide,
    examples: Sequence[Example],
    *,
    values: Mapping[Parameter, Any] | None = None,
    min_score: float | None = None,
    concurrency: int = 16,
) -> list[Rollout]:
    """`run_rollout` on every example, at most `concurrency` at once, in input order."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    gate = asyncio.Semaphore(concurrency)

    async def one(example: Example) -> Rollout:
        async with gate:
            return await run_rollout(agent, guide, example, values=values, min_score=min_score)

    return await gather_all(one(e) for e in examples)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
