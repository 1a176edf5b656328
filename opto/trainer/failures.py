"""Making failed rollouts visible: the first of each kind logged, too many stop the run."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from ..core.rollout import Rollout
from ..errors import OptoError, OptoTypeError, OptoValueError

__all__ = ["FailureLog", "TooManyFailures", "check_failures", "validate_max_failures"]

logger = logging.getLogger("opto.trainer")

#: The default `max_failures`: stop when every rollout of a step (or evaluation) failed.
DEFAULT_MAX_FAILURES = 1.0


class TooManyFailures(OptoError, RuntimeError):
    """Too many rollouts of one step or evaluation failed (see `max_failures`).

    `train()` raises it once the run is saved: its message says how to resume, and
    `result` holds the `TrainResult` of what was done (None when raised by `evaluate`).
    """

    result: Any = None


def validate_max_failures(max_failures: int | float | None) -> None:
    """An int >= 1 (a count), a float in (0, 1] (a fraction), or None (never stop)."""
    if max_failures is None:
        return
    if isinstance(max_failures, bool) or not isinstance(max_failures, (int, float)):
        raise OptoTypeError(f"max_failures must be an int, a float or None, got {type(max_failures).__name__}")
    if isinstance(max_failures, int) and max_failures < 1:
        raise OptoValueError(f"max_failures as a count must be >= 1, got {max_failures}")
    if isinstance(max_failures, float) and not 0.0 < max_failures <= 1.0:
        raise OptoValueError(f"max_failures as a fraction must be within (0, 1], got {max_failures}")


def check_failures(rollouts: Sequence[Rollout], max_failures: int | float | None, where: str) -> None:
    """Raise `TooManyFailures` when the failed rollouts reach `max_failures`.

    An int counts failed rollouts; a float is a fraction of `rollouts` (1.0: all).
    """
    if max_failures is None or not rollouts:
        return
    failed = [r for r in rollouts if r.failed]
    limit = max_failures if isinstance(max_failures, int) else math.ceil(max_failures * len(rollouts))
    if failed and len(failed) >= max(1, limit):
        raise TooManyFailures(
            f"{len(failed)} of {len(rollouts)} rollouts failed in {where} (max_failures={max_failures}); "
            f"the first: {failed[0].error} (example {failed[0].example_id!r})"
        )


class FailureLog:
    """Logs the first failure of each kind (agent or guide, and the exception type) at
    WARNING with its message; later ones of the same kind go to DEBUG."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def note(self, rollouts: Sequence[Rollout], where: str) -> None:
        for rollout in rollouts:
            if rollout.error is None:
                continue
            kind = ":".join(rollout.error.split(":", 2)[:2])
            if kind in self._seen:
                logger.debug("%s: example %r failed: %s", where, rollout.example_id, rollout.error)
                continue
            self._seen.add(kind)
            logger.warning(
                "%s: example %r failed: %s (further failures of this kind are logged at DEBUG)",
                where,
                rollout.example_id,
                rollout.error,
            )
