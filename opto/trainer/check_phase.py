"""`CheckPhase`: the final check's part of a run, as one object the trainer calls.

Before the first step it probes the agent for noise; as the run goes it keeps what the
check will need of the search (the candidates compared, the training examples decided
on, the scores measured of the values the search moved through); at the end it picks the
check's examples and runs the check (`check_final_values`). It also says what all that
costs, for budgets, stop conditions and the estimate. The trainer owns the agent, the
validation policy and the ledger; this object owns none of them.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from typing import Any

from ..core.data import Example
from ..core.rollout import Rollout
from ..run.results import FinalCheckResult
from ..search.copies import CopyGuard
from ..search.final_check import FinalCheck
from .final_check import NoiseProbe, Runner, check_final_values, probe_noise

__all__ = ["CheckPhase"]

logger = logging.getLogger(__name__)


class CheckPhase:
    """The noise probe, the check's bookkeeping during the search, and the check itself.

    Args:
        settings: the run's `FinalCheck`.
    """

    def __init__(self, settings: FinalCheck) -> None:
        self.settings = settings
        self.reset([], [], 0)

    def reset(self, train: list[Example], reserved: list[Example], seed: int) -> None:
        """A new run on `train` (what it trains on) with `reserved` set apart for the check."""
        self.train, self.reserved, self.seed = train, reserved, seed
        self.noise: NoiseProbe | None = None
        self.compared = 0  # candidates measured on the run's examples: the check's selection count
        self.decided: set[str | None] = set()  # training examples a step proposed from or screened on
        # What the search measured of the values it moved through ({values digest: {example id: score}}):
        # a check of a deterministic agent reads them instead of paying for the same answers again.
        self.recorded: dict[str, dict[str, float]] = {}

    # Before the first step ---------------------------------------------------------------

    @property
    def probed(self) -> bool:
        return self.noise is not None

    async def probe(self, runner: Runner) -> list[Rollout]:
        """Run the starting `values` twice on a few training examples: any disagreement means
        a noisy agent or judge, which decisions and the check meet with repeated rollouts."""
        size = min(self.settings.probe, len(self.train))
        examples = random.Random(f"opto-probe|{self.seed}").sample(self.train, size)
        self.noise, rollouts = await probe_noise(runner, examples)
        if self.noise.noisy:
            logger.info(
                "the agent or judge is noisy: %d of %d examples scored differently when run twice with the same "
                "values; candidates that win and the final check are measured %d times",
                self.noise.disagreed,
                self.noise.examples,
                self.settings.repeats,
            )
        else:
            self.remember(rollouts)
        return rollouts

    # During the search -------------------------------------------------------------------

    def note_batch(self, batch: Sequence[Example]) -> None:
        """A step decides on `batch`: its examples are no longer fresh evidence."""
        self.decided.update(e.id for e in batch)

    def note_compared(self, measured: int) -> None:
        """`measured` more candidates were scored on the run's examples."""
        self.compared += measured

    def remember(self, rollouts: Sequence[Rollout]) -> None:
        """Keep the scores the search measured, under the values each rollout ran with
        (its `values_hash`; each example's first; a failed rollout's is not an answer to
        read again). A noisy agent's are not kept: its check draws afresh."""
        if self.noise is not None and self.noise.noisy:
            return
        for rollout in rollouts:
            if rollout.score is not None and not rollout.failed and rollout.values_hash is not None:
                self.recorded.setdefault(rollout.values_hash, {}).setdefault(rollout.example_id, rollout.score)

    # The check ---------------------------------------------------------------------------

    def examples(self, validation: Sequence[Example]) -> tuple[str, list[Example]]:
        """The check's kind and examples: the reserved ones ("held-out"); training examples
        no step decided on ("unseen", with a `rerun_size` check that keeps its calls, when
        enough are left); else the training and validation examples again ("repeated
        rollouts"), a seeded sample of `rerun_size` of them when that is set."""
        if self.reserved:
            return "held-out", self.reserved
        size = self.settings.rerun_size
        raced = self.decided | {e.id for e in validation}  # the validation set may be the training set
        unseen = [e for e in self.train if e.id not in raced]
        if size is not None and self.settings.keep_calls and len(unseen) >= size:
            return "unseen", self._sample(unseen, size, "opto-unseen")
        found = list({e.id: e for e in [*self.train, *validation]}.values())
        if size is not None and len(found) > size:
            found = self._sample(found, size, "opto-rerun")
        return "repeated rollouts", found

    def _sample(self, examples: list[Example], size: int, salt: str) -> list[Example]:
        chosen = {e.id for e in random.Random(f"{salt}|{self.seed}").sample(examples, size)}
        return [e for e in examples if e.id in chosen]

    async def check(
        self,
        runner: Runner,
        validation: Sequence[Example],
        *,
        start: dict[str, Any],
        final: dict[str, Any],
        fallback: dict[str, Any] | None,
        guard: CopyGuard | None,
        search_score: float | None,
        on_made: Callable[[list[Rollout]], None],
        allowance: int | None,
    ) -> tuple[FinalCheckResult, dict[str, Any]]:
        """The check's result and the values to return (`check_final_values`)."""
        kind, examples = self.examples(validation)
        result, values, _ = await check_final_values(
            runner,
            self.settings,
            examples=examples,
            kind=kind,
            start=start,
            final=final,
            fallback=fallback,
            noisy=self.noise.noisy if self.noise is not None else False,
            guard=guard,
            search_score=search_score,
            compared=self.compared,
            on_made=on_made,
            recorded=self.recorded,
            allowance=allowance,
        )
        return result, values

    # What it costs -----------------------------------------------------------------------

    def probe_rollouts(self, made_too: bool = False) -> int:
        """The noise probe's rollouts (its examples twice) when it is still to be run
        (`made_too`: also when it was)."""
        return 0 if self.probed and not made_too else 2 * min(self.settings.probe, len(self.train))

    def calls(self, validation: Sequence[Example], most: bool = False) -> int:
        """The check's first look: the start and the final values once on each of its
        examples; `most`: a noisy agent's every round, and a fallback too."""
        examples = len(self.examples(validation)[1])
        if not most:
            return 2 * examples
        return 3 * self.settings.rounds(examples) * examples

    def kept_calls(self, validation: Sequence[Example]) -> int:
        """What a call or metric-call limit keeps for the check (none when it keeps none)."""
        return self.calls(validation) if self.settings.keep_calls else 0

    # Resume ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"compared": self.compared}
        if self.noise is not None:
            state["noise"] = self.noise.model_dump()
        if self.settings.rerun_size is not None:  # only such a check reads it
            state["decided"] = sorted(str(i) for i in self.decided)
        if self.recorded:
            state["recorded"] = self.recorded
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.noise = NoiseProbe.model_validate(state["noise"]) if state.get("noise") else None
        self.compared = state.get("compared", 0)
        self.decided = set(state.get("decided", []))
        self.recorded = {key: dict(scores) for key, scores in state.get("recorded", {}).items()}
