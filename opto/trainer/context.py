"""`StepContext`: what one step of training needs besides its batch."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..core.guides import Guide
from ..core.logged import LoggedRollout
from ..run.events import LedgerEvent, StepRecord
from .failures import DEFAULT_MAX_FAILURES, FailureLog

__all__ = ["StepContext"]


class StepContext(BaseModel):
    """What one step needs besides its batch."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    step: int
    epoch: int
    guide: Guide
    stepsize: float
    min_score: float | None
    verbose: bool
    max_failures: int | float | None = DEFAULT_MAX_FAILURES
    rollout_timeout: float | None = None
    failure_log: FailureLog = Field(default_factory=FailureLog)
    # What the step has done so far; the loop hands it to the sinks when the step ends.
    step_record: StepRecord | None = None
    # Production's runs of the current values: the batch's rollouts, judged but not run again.
    logged: list[LoggedRollout] | None = None
    # The final check's: the rollouts a metric-call limit still allows (None: no limit).
    rollouts_left: int | None = None

    def emit(self, event: LedgerEvent) -> None:
        """Add an event to this step's record (nothing is written during a step)."""
        if self.step_record is not None:
            self.step_record.add(event)
