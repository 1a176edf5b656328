"""The typed ledger: one pydantic model per record kind, and the record of a step.

Every line of `ledger.jsonl` is one `LedgerEvent`, told apart by its `type`. A step
builds a `StepRecord` (its events in the order they happened) and hands it to the
sinks (the run directory, callbacks); nothing inside a step writes a file.

`LEDGER_VERSION` is written in every event as `v`. Version 1 (before events had a
version) had the same kinds and fields; `v` is then 1 and `proposer` "optimizer".
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from ..core.rollout import RolloutFields
from ..search.aggregation import Candidate
from ..search.proposers import Proposal

__all__ = [
    "AggregateErrorEvent",
    "AppliedEvent",
    "CandidateEvent",
    "DecisionEvent",
    "LEDGER_VERSION",
    "LedgerEvent",
    "ParentEvent",
    "PoolEvent",
    "ProposalErrorEvent",
    "ProposalEvent",
    "ProposalScore",
    "ProposalScoreEvent",
    "RolloutEvent",
    "StepRecord",
    "parse_event",
]

LEDGER_VERSION = 2


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: int
    time: float = Field(default_factory=time.time)
    v: int = LEDGER_VERSION

    @model_validator(mode="before")
    @classmethod
    def _versioned(cls, data: Any) -> Any:
        # A record without `v` was written before the ledger had versions.
        if isinstance(data, dict) and "v" not in data and "time" in data:
            data = {**data, "v": 1}
        return data


class RolloutEvent(_Event, RolloutFields):
    """One run of agent and guide: `phase` "train" (current values), "validation" (a
    candidate's, `candidate_id`), "screening" (a candidate's on the step's batch, before
    `MinibatchFirst` validates it), "proposal_validation" (a proposal's, `proposal_id`) or
    "collect" (sample `sample` of `opto.collect`)."""

    type: Literal["rollout"] = "rollout"
    phase: str
    candidate_id: str | None = None
    proposal_id: str | None = None
    instance_id: str
    sample: int | None = None  # which of an example's samples (phase "collect", `opto.collect`)


class ProposalEvent(_Event, Proposal):
    """One proposal (see `opto.search.proposers.Proposal`)."""

    type: Literal["proposal"] = "proposal"
    proposal_id: str


class ProposalErrorEvent(_Event):
    """A proposer's model failed on one instance (after its retries)."""

    type: Literal["proposal_error"] = "proposal_error"
    instance_id: str
    proposer: str = "optimizer"
    error: str


class ProposalScore(BaseModel):
    """The score of one proposal's update applied on its own (None: not scored, see `note`)."""

    proposal_id: str
    instance_id: str
    score: float | None = None
    mode: str
    num_rollouts: int = 0
    note: str = ""


class ProposalScoreEvent(_Event, ProposalScore):
    """A proposal's update scored on its own (`score_proposals`)."""

    type: Literal["proposal_score"] = "proposal_score"


class CandidateEvent(_Event, Candidate):
    """One aggregator result (see `opto.search.aggregation.Candidate`); `final` False for an
    intermediate group merge (group merges are events of their own, not nested)."""

    type: Literal["candidate"] = "candidate"
    final: bool = True
    candidate_id: str
    groups: list[Candidate] = Field(default_factory=list, exclude=True)


class AggregateErrorEvent(_Event):
    """The aggregator's model failed: the step makes no update."""

    type: Literal["aggregate_error"] = "aggregate_error"
    error: str


class DecisionEvent(_Event):
    """The verdict on one candidate; with `candidate_id` None, why the step had none."""

    type: Literal["decision"] = "decision"
    candidate_id: str | None = None
    accepted: bool | None = None
    current_score: float | None = None
    candidate_score: float | None = None
    reason: str = ""
    validation: str | None = None
    stage: str | None = None  # MinibatchFirst: "minibatch" (rejected on the batch) or "dataset"
    rollouts_saved: int = 0  # validation rollouts a rejection on the batch did not need
    # With a validation `alpha`: the paired test, its p-value, the mean difference and its 95% interval.
    test: str | None = None
    p_value: float | None = None
    difference: float | None = None
    difference_interval: tuple[float, float] | None = None
    # Examples the candidate won and lost against the current values, and the rule's level.
    wins: int | None = None
    losses: int | None = None
    alpha: float | None = None
    # Examples left out because the candidate or the current values quote them: {id: what}.
    quoted: dict[str, str] = Field(default_factory=dict)


class AppliedEvent(_Event):
    """The update written to the stored values."""

    type: Literal["applied"] = "applied"
    candidate_id: str
    update: dict[str, Any]


class ParentEvent(_Event):
    """Pareto selection: the pool member this step starts from, and the front it was drawn from."""

    type: Literal["parent"] = "parent"
    candidate_id: str
    front: dict[str, int]
    mean: float | None = None


class PoolEvent(_Event):
    """Pareto selection: a validated candidate joins the pool with its per-example scores."""

    type: Literal["pool"] = "pool"
    candidate_id: str
    values: dict[str, Any]
    scores: dict[str, float | None]
    from_step: int = 0
    parent_id: str | None = None
    merge_parent_id: str | None = None  # a merge of two lineages: its second parent
    costs: dict[str, float] = Field(default_factory=dict)  # mean per rollout, by objective ("cost", "latency")
    pool_mean: float | None = None


LedgerEvent = Annotated[
    RolloutEvent
    | ProposalEvent
    | ProposalErrorEvent
    | ProposalScoreEvent
    | CandidateEvent
    | AggregateErrorEvent
    | DecisionEvent
    | AppliedEvent
    | ParentEvent
    | PoolEvent,
    Field(discriminator="type"),
]
"""Any ledger record, told apart by `type`."""

_ADAPTER: TypeAdapter[Any] = TypeAdapter(LedgerEvent)


def parse_event(record: dict[str, Any]) -> LedgerEvent:
    """A ledger line (a dict) as its typed event; pydantic's ValidationError if it is none."""
    return _ADAPTER.validate_python(record)


class StepRecord(BaseModel):
    """Everything one training step did, in order, plus its outcome.

    `events` are the step's ledger events in the order they happened; the typed views
    (`rollouts`, `proposals`, ...) filter them. `score` is the batch score under the
    values the step started from; `accepted` is None when no candidate was made.
    """

    step: int
    epoch: int = 0
    events: list[LedgerEvent] = Field(default_factory=list)
    score: float | None = None
    accepted: bool | None = None
    candidate_score: float | None = None
    update: dict[str, Any] = Field(default_factory=dict)
    note: str = ""
    start_values: dict[str, Any] = Field(default_factory=dict)  # the values the step started from

    def add(self, event: LedgerEvent) -> None:
        self.events.append(event)

    def _of(self, kind: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]

    @property
    def rollouts(self) -> list[RolloutEvent]:
        return self._of(RolloutEvent)

    @property
    def proposals(self) -> list[ProposalEvent]:
        return self._of(ProposalEvent)

    @property
    def proposal_scores(self) -> list[ProposalScoreEvent]:
        return self._of(ProposalScoreEvent)

    @property
    def candidates(self) -> list[CandidateEvent]:
        return self._of(CandidateEvent)

    @property
    def decisions(self) -> list[DecisionEvent]:
        return self._of(DecisionEvent)

    @property
    def applied(self) -> AppliedEvent | None:
        found = self._of(AppliedEvent)
        return found[0] if found else None
