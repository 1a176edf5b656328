"""Proposal batching: which proposers see one rollout at a time, and which a step's batch.

`Reflective` (the default) asks every proposer that can look at a whole batch (a
`BatchProposer`, e.g. `Optimizer`) once a step; `PerInstance` asks each proposer for
every rollout. Either way a proposer that only makes sense once a step (`per_step`, e.g.
`TPEProposer`) is asked once a step, and one without `propose_batch` (`DemoProposer`)
per instance.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .proposers import BatchProposer, Proposer

__all__ = ["PerInstance", "ProposalBatching", "Reflective"]


@runtime_checkable
class ProposalBatching(Protocol):
    """Decides, for each proposer, whether it is asked once a step (with the step's rollouts)."""

    name: str

    def once_a_step(self, proposer: Proposer) -> bool: ...


class Reflective:
    """Every proposer that can look at a batch is asked once a step, shown the batch."""

    name = "reflective"

    def once_a_step(self, proposer: Proposer) -> bool:
        return isinstance(proposer, BatchProposer)


class PerInstance:
    """Every proposer is asked for every rollout, but those that only make sense once a step."""

    name = "per_instance"

    def once_a_step(self, proposer: Proposer) -> bool:
        return isinstance(proposer, BatchProposer) and bool(getattr(proposer, "per_step", False))
