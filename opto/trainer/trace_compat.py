"""The method names Trace users know, as a thin adapter over `AggregatedUpdate`'s stages.

`forward(agent, x, guide, info)` runs and judges one instance and asks the proposers;
`update(outputs)` aggregates, validates and applies, as one step would;
`to_param_dict(update_dict)` maps names to this agent's `Parameter`s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .._util.async_tools import run_sync
from ..core.agent import Agent
from ..core.data import Example
from ..core.guides import Guide
from ..core.parameters import Parameter
from ..core.rollout import Rollout, run_rollout
from ..errors import OptoValueError
from ..run.events import StepRecord
from ..search.proposers import Proposal
from .minibatch import StepContext, StepOutcome

__all__ = ["InstanceOutput", "TraceCompatible"]


class InstanceOutput(BaseModel):
    """What `forward` returns for one instance: its rollout and its proposals."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    rollout: Rollout
    proposals: list[Proposal] = Field(default_factory=list)
    error: str | None = None


class TraceCompatible:
    """Mixin of `AggregatedUpdate`: Trace's `forward` / `update` / `to_param_dict`."""

    agent: Agent

    def remember(self, guide: Guide, stepsize: float, min_score: float | None) -> None:
        """The settings `update()` uses outside `train()` (train() records its own)."""
        self.guide, self.stepsize, self.min_score = guide, stepsize, min_score

    def to_param_dict(self, update_dict: dict[str, Any]) -> dict[Parameter, Any]:
        """{parameter name: value} -> {Parameter: value} for this agent."""
        return self.agent.resolve(update_dict)

    def forward(self, agent: Agent, x: Any, guide: Guide, info: Any) -> InstanceOutput:
        """Run one instance, judge it and ask the proposers."""
        return run_sync(self.aforward(agent, x, guide, info))

    def update(self, outputs: Sequence[InstanceOutput]) -> StepOutcome:
        """Aggregate the proposals of `outputs`, validate the candidates, apply the best accepted one."""
        return run_sync(self.aupdate(outputs))

    async def aforward(self, agent: Agent, x: Any, guide: Guide, info: Any, *, example_id: str = "") -> InstanceOutput:
        """Async `forward`."""
        if getattr(self, "guide", None) is None or self.guide is not guide:
            self.remember(guide, getattr(self, "stepsize", 0.5), getattr(self, "min_score", 0.0))
        rollout = await run_rollout(agent, guide, Example(x, info, id=example_id), min_score=self.min_score)
        return await self._propose(rollout, self._context())  # type: ignore[attr-defined]

    async def aupdate(self, outputs: Sequence[InstanceOutput]) -> StepOutcome:
        """Async `update`."""
        if getattr(self, "guide", None) is None:
            raise OptoValueError("update() needs the guide given to forward(); call forward() first")
        rollouts = [o.rollout for o in outputs]
        proposals = [p for o in outputs for p in o.proposals]
        record: StepRecord = await self._decide(rollouts, proposals, self._context())  # type: ignore[attr-defined]
        return StepOutcome(
            score=record.score,
            accepted=record.accepted,
            candidate_score=record.candidate_score,
            update=record.update,
            note=record.note,
        )

    def _context(self) -> StepContext:
        return StepContext(
            step=0,
            epoch=0,
            guide=self.guide,
            stepsize=self.stepsize,
            min_score=self.min_score,
            verbose=False,
            step_record=StepRecord(step=0),
        )
