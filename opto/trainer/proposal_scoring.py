"""Scoring each optimizer proposal on its own, so an optimizer turn becomes preference data.

With `Optimizer(num_proposals=n > 1)` the optimizer answers one prompt with several
proposals. The trainer only ever validates the aggregated candidate, so nothing says which
of those proposals was better. `score_proposals` fills that gap: it applies each proposal's
update alone and re-runs

- ``"instance"``: the instance the proposal was made for, or
- ``"minibatch"``: the whole step's batch,

and records the mean score. Every re-run is a ledger ``rollout`` record with phase
``"proposal_validation"`` and the ``proposal_id``; every proposal gets a ``proposal_score``
record (``proposal_id``, ``instance_id``, ``score``, ``mode``, ``num_rollouts``, ``note``).
`opto.preference` reads them back as optimizer turns.

A proposal that asks for no change (a readable reply whose values all equal the current
ones, or TERMINATE) is not re-run: the current values' score on the same examples, already
known from the step's rollouts, is its score. A proposal with an empty update for any other
reason (unreadable reply, every value invalid) is not scored: ``score: null`` and a note.
Identical updates made for the same examples are run once and share the score. This costs
one agent run (plus judging) per proposal and instance ("instance") or per proposal and
batch example ("minibatch"); it only pays off with ``num_proposals > 1``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any, cast

from .._util.async_tools import gather_all
from .._util.files import json_key
from ..core.agent import Agent
from ..core.data import Example
from ..core.guides import Guide
from ..core.rollout import Rollout, mean_score
from ..errors import OptoValueError
from ..executors.local import AsyncioExecutor, RolloutExecutor
from ..run.events import ProposalScore, ProposalScoreEvent, RolloutEvent
from ..search.proposers import Proposal
from .minibatch import StepContext

__all__ = ["PROPOSAL_SCORING_MODES", "ProposalScore", "check_score_proposals", "score_proposals"]

logger = logging.getLogger(__name__)

PROPOSAL_SCORING_MODES: tuple[str, ...] = ("instance", "minibatch")


def check_score_proposals(mode: str | None) -> str | None:
    """Validate the trainer's `score_proposals` setting; returns it unchanged."""
    if mode is not None and mode not in PROPOSAL_SCORING_MODES:
        raise OptoValueError(
            f"score_proposals must be None, 'instance' or 'minibatch', got {mode!r}: 'instance' re-runs the "
            "instance a proposal was made for, 'minibatch' the step's whole batch"
        )
    return mode


async def score_proposals(
    mode: str,
    agent: Agent,
    guide: Guide,
    rollouts: Sequence[Rollout],
    proposals: Sequence[Proposal],
    *,
    ctx: StepContext | None = None,
    min_score: float | None = None,
    concurrency: int = 16,
    timeout: float | None = None,
    executor: RolloutExecutor | None = None,
) -> list[ProposalScore]:
    """Score every proposal's update on its own and record the results in `ctx`'s ledger.

    Args:
        mode: "instance" or "minibatch" (see the module docstring).
        agent: the trained agent; updates are applied through `agent.resolve`, never stored.
        guide: the step's guide.
        rollouts: the step's rollouts under the current values (they define the batch).
        proposals: the step's proposals.
        ctx: the step (`StepContext`) whose record gets the events; None records nothing.
        min_score: the score of a failed rollout (as in training).
        concurrency: agent runs at once, about.
        timeout: seconds after which one rollout counts as failed (None: no limit).
        executor: where the rollouts run (default: in-process asyncio, `concurrency` at once).

    Returns:
        One `ProposalScore` per proposal, in input order.
    """
    check_score_proposals(mode)
    if not proposals:
        return []
    scorer = _Scorer(mode, agent, guide, rollouts, min_score, concurrency, timeout, executor)
    try:
        results = await gather_all(scorer.one(p) for p in proposals)
    finally:
        scorer.cancel()
    if ctx is not None:
        _record(ctx, results)
    scores = [result for result, _ in results]
    logger.info(
        "scored %d proposals (%s): %s",
        len(scores),
        mode,
        ", ".join("n/a" if s.score is None else f"{s.score:.3f}" for s in scores),
    )
    return scores


class _Scorer:
    """One step's proposal scoring: each distinct update run once on its examples, the
    runs at once bounded so the whole keeps to about `concurrency` agent runs."""

    def __init__(
        self,
        mode: str,
        agent: Agent,
        guide: Guide,
        rollouts: Sequence[Rollout],
        min_score: float | None,
        concurrency: int,
        timeout: float | None,
        executor: RolloutExecutor | None,
    ) -> None:
        self.mode, self.agent, self.guide, self.rollouts = mode, agent, guide, rollouts
        self.min_score, self.timeout = min_score, timeout
        self.by_instance = {r.example_id: Example(r.x, r.info, id=r.example_id) for r in rollouts}
        self.batch = list(self.by_instance.values())
        # Each proposal's run starts up to `len(examples)` rollouts.
        per_run = 1 if mode == "instance" else max(1, len(self.batch))
        self.gate = asyncio.Semaphore(max(1, concurrency // per_run))
        self.shared: dict[str, asyncio.Task[list[Rollout]]] = {}
        self.runner = executor or AsyncioExecutor(concurrency)

    async def run(self, examples: list[Example], update: dict[str, Any]) -> list[Rollout]:
        async with self.gate:
            return await self.runner.run(
                self.agent,
                self.guide,
                examples,
                values=self.agent.resolve(cast(Mapping[Any, Any], update)),
                min_score=self.min_score,
                timeout=self.timeout,
            )

    def examples_for(self, proposal: Proposal) -> list[Example]:
        if self.mode == "minibatch":
            return self.batch
        example = self.by_instance.get(proposal.instance_id)
        return [example] if example is not None else []

    async def one(self, proposal: Proposal) -> tuple[ProposalScore, list[Rollout]]:
        """The proposal's score, and the rollouts run for it (none when reused or not run)."""
        base: dict[str, Any] = {
            "proposal_id": proposal.proposal_id,
            "instance_id": proposal.instance_id,
            "mode": self.mode,
        }
        examples = self.examples_for(proposal)
        if not examples:
            return ProposalScore(**base, note=f"instance {proposal.instance_id!r} is not in the step's batch"), []
        if not proposal.update:
            if proposal.skipped or proposal.unreadable:
                return ProposalScore(**base, note="the proposal carries no usable update; nothing to score"), []
            ids = {e.id for e in examples}
            current = mean_score([r for r in self.rollouts if r.example_id in ids])
            return ProposalScore(
                **base, score=current, note="no change proposed: the current values' score is its score"
            ), []
        key = json_key([[e.id for e in examples], proposal.update])
        fresh = key not in self.shared
        if fresh:
            self.shared[key] = asyncio.ensure_future(self.run(examples, proposal.update))
        scored = await self.shared[key]
        score = mean_score(scored)
        note = "" if fresh else "same update as another proposal of this step; its score is reused"
        if score is None:
            note = "no rollout could be scored"
        return ProposalScore(**base, score=score, num_rollouts=len(scored), note=note), scored if fresh else []

    def cancel(self) -> None:
        for task in self.shared.values():
            if not task.done():
                task.cancel()


def _record(ctx: StepContext, results: Sequence[tuple[ProposalScore, list[Rollout]]]) -> None:
    """Each proposal's rollouts and score into the step's record."""
    for result, scored in results:
        for rollout in scored:
            ctx.emit(
                RolloutEvent(step=ctx.step, phase="proposal_validation", proposal_id=result.proposal_id,
                             **rollout.to_record())
            )  # fmt: skip
        ctx.emit(ProposalScoreEvent(step=ctx.step, **result.model_dump(mode="json")))
