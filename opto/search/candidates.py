"""Where a step's candidates come from: the aggregator's merge, each proposal, or both.

A `CandidateSource` turns the step's proposals into candidate updates, each validated on
its own. `MergedCandidates` is opto's aggregation (one LLM merge, `num_candidates`
samples); `EachProposal` makes every distinct proposal a candidate of its own, with no
model call, as GEPA does with its one reflective proposal per step; `MergedAndEach`
does both. Every candidate lists the proposals it came from (`source_proposals`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from .._util.files import json_key
from ..core.parameters import Parameter
from .aggregation import Aggregator, Candidate, dedupe
from .proposers import Proposal

__all__ = ["CandidateSource", "EachProposal", "MergedAndEach", "MergedCandidates"]


@runtime_checkable
class CandidateSource(Protocol):
    """Turns a step's proposals into candidates (may raise `LLMError`: the step then has none)."""

    name: str
    # The fewest model calls and candidates a step with proposals makes (for the budget check).
    min_calls: int
    min_candidates: int

    async def candidates(
        self, parameters: Sequence[Parameter], proposals: Sequence[Proposal], stepsize: float
    ) -> list[Candidate]: ...


class MergedCandidates:
    """The aggregator's merge of all proposals (the default). A step whose only update is
    one reflective proposal has nothing to merge: it is the candidate, with no call."""

    name = "merged"
    min_calls = 1

    def __init__(self, aggregator: Aggregator) -> None:
        self.aggregator = aggregator
        self.min_candidates = aggregator.num_candidates

    async def candidates(
        self, parameters: Sequence[Parameter], proposals: Sequence[Proposal], stepsize: float
    ) -> list[Candidate]:
        distinct = dedupe(proposals)
        if len(distinct) == 1 and all(p.instance_ids for p in proposals if p.update):
            return await EachProposal().candidates(parameters, proposals, stepsize)  # one reflective proposal
        return await self.aggregator.aggregate(parameters, proposals, stepsize)


class EachProposal:
    """Every distinct proposed update as a candidate of its own (no model call).

    Proposals with the same update make one candidate that lists them all.
    """

    name = "each"
    min_calls = 0
    min_candidates = 1

    async def candidates(
        self, parameters: Sequence[Parameter], proposals: Sequence[Proposal], stepsize: float
    ) -> list[Candidate]:
        return [
            Candidate(
                update=dict(found.update),
                reasoning=found.reasoning,
                extraction_method="proposal",
                source_proposals=list(found.sources),
            )
            for found in dedupe(proposals)
        ]


class MergedAndEach:
    """The aggregator's candidates, then each distinct proposal not already among them."""

    name = "both"
    min_calls = 1

    def __init__(self, aggregator: Aggregator) -> None:
        self.merged, self.each = MergedCandidates(aggregator), EachProposal()
        self.min_candidates = self.merged.min_candidates

    async def candidates(
        self, parameters: Sequence[Parameter], proposals: Sequence[Proposal], stepsize: float
    ) -> list[Candidate]:
        merged = await self.merged.candidates(parameters, proposals, stepsize)
        seen = {json_key(c.update) for c in merged if c.update}
        each = [
            c for c in await self.each.candidates(parameters, proposals, stepsize) if json_key(c.update) not in seen
        ]
        return [*merged, *each]
