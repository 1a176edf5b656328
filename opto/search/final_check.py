"""The final check: what `train()` returns is compared with the values it started from,
on evidence that no decision of the run used.

The search may move on weak evidence (a tie, a win on a noisy batch); what the user gets
back must hold on examples the search never decided on. `FinalCheck` reserves a seeded
share of the training data up front (never proposed from, never validated on). When the
data is too small to spare it, the check runs the agent again on every training example,
several times where the agent or judge is noisy (fresh rollouts). Either way the final
values and the start are compared example by example with a one-sided paired test
(`opto.core.stats.paired_test`); values that are not shown better are not returned
(`opto.trainer.final_check` picks what is).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..core.data import Example, load_dataset
from ..core.logged import LoggedRollout, logged_examples
from ..errors import OptoValueError
from .holdout import seeded_split

__all__ = ["FinalCheck"]


@dataclass(frozen=True)
class FinalCheck:
    """How `train()` checks the values it returns (the default of `AggregatedUpdate`'s
    `final_check`).

    Args:
        fraction: the share of the training data reserved for the check when there is
            enough of it (`min_data` examples or more): at least `min_size`, at most
            `max_size` examples, drawn with the run's seed.
        power_size: the examples reserved at least, when the data leaves the search as
            many (half of it at most): enough for a few points' gain from a good start to
            pass (`bench/robustness.py`'s 240-example row). 0: `fraction` alone.
        min_size: the fewest examples reserved.
        max_size: the most examples reserved.
        min_data: training examples below which nothing is reserved; the check then runs
            the agent again on the training examples (`repeats` times each).
        alpha: the level of the one-sided paired test "the returned values are no better
            than the start". A fallback candidate is tested at `alpha / 2`.
        repeats: rollouts per example and values when the agent or judge is noisy (two
            runs of the same values disagreed), at the check's second look; more on a
            check of few examples, so that each side has at least `min_rollouts`.
        min_rollouts: the fewest rollouts of each side at a noisy check's second look.
        probe: examples run twice under the starting values, before the first step, to
            find out whether the agent or judge is noisy; 0 runs none, and the agent is
            then taken as deterministic (a small budget's choice: the check is then held to
            the reused-evidence level, which also holds for a noisy agent, if with less power).
        rerun_size: with nothing reserved, the most examples the check runs again (a
            seeded sample of the training and validation examples); None: all of them.
            A run on a small metric-call budget (GEPA's bridge) keeps the check's cost
            in proportion with it. The sample is drawn from the training examples no
            step decided on when enough of them are left (fresh evidence).
        keep_calls: keep the check's first look out of a call or metric-call limit, so the
            search stops early enough to pay for it. False (a small budget): the search
            spends the whole limit, and the check of a deterministic agent reads what the
            search measured and runs only the examples it lacks, within what is left.
        examples: the examples to check on instead of reserving some of the training
            data (any dataset shape `train()` takes, or `LoggedRollout`s: the newest
            traces, `opto.core.logged.split_newest`); the search never decides on them.
    """

    fraction: float = 0.25
    power_size: int = 120
    min_size: int = 16
    max_size: int = 200
    min_data: int = 96
    alpha: float = 0.1
    repeats: int = 3
    probe: int = 12
    min_rollouts: int = 60
    rerun_size: int | None = None
    examples: Sequence[Any] | None = None
    keep_calls: bool = True

    def __post_init__(self) -> None:
        if not 0 < self.fraction < 1:
            raise OptoValueError(f"FinalCheck fraction must be within (0, 1), got {self.fraction!r}")
        if not 1 <= self.min_size <= self.max_size:
            raise OptoValueError(f"FinalCheck needs 1 <= min_size <= max_size, got {self.min_size}, {self.max_size}")
        if self.min_data < 2 * self.min_size:
            raise OptoValueError(f"FinalCheck min_data must be at least 2 * min_size, got {self.min_data}")
        if not 0 < self.alpha < 1:
            raise OptoValueError(f"FinalCheck alpha must be a level in (0, 1), e.g. 0.1, got {self.alpha!r}")
        for name, least in (("repeats", 1), ("probe", 0), ("min_rollouts", 1), ("power_size", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise OptoValueError(f"FinalCheck {name} must be an int >= {least}, got {value!r}")
        if self.rerun_size is not None and (not isinstance(self.rerun_size, int) or self.rerun_size < 1):
            raise OptoValueError(f"FinalCheck rerun_size must be an int >= 1 or None, got {self.rerun_size!r}")

    def reserve(self, examples: list[Example], seed: int) -> tuple[list[Example], list[Example]]:
        """(examples left to train on, examples reserved for the check), both in their
        original order; nothing is reserved from fewer than `min_data` examples. Given
        `examples` are the check's, and none of the training data is reserved."""
        if self.examples is not None:
            return examples, self._given(examples)
        if len(examples) < self.min_data:
            return examples, []
        fraction = max(self.fraction, min(0.5, self.power_size / len(examples)))
        return seeded_split(examples, fraction, self.min_size, self.max_size, f"opto-final-check|{seed}")

    def _given(self, training: list[Example]) -> list[Example]:
        given = list(self.examples or [])
        if not given:
            raise OptoValueError("FinalCheck examples is empty: give the examples to check on, or leave it None")
        found = logged_examples(given) if all(isinstance(e, LoggedRollout) for e in given) else load_dataset(given)
        shared = sorted({str(e.id) for e in found} & {str(e.id) for e in training})
        if shared:
            raise OptoValueError(
                f"FinalCheck examples share ids with the training data ({', '.join(map(str, shared[:5]))}): the "
                "check must run on examples the search never decides on"
            )
        return found

    def rounds(self, examples: int) -> int:
        """Rollouts per example at a noisy check's second look."""
        return max(self.repeats, -(-self.min_rollouts // max(1, examples)))
