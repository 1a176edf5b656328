"""What a run returns: `TrainResult` (a `train` call) and `EvalResult` (one evaluation).

They live here, below the trainer that makes them, so that callbacks and reports can
name them without importing the training loop.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from ..core.rollout import Rollout, mean_score
from ..core.stats import Interval, score_interval
from ..llm.usage import UsageStats

__all__ = ["EvalResult", "FinalCheckResult", "TrainResult"]


class EvalResult(BaseModel):
    """Scores of one evaluation. `mean` and `std` skip unjudged (None) scores; `n_failed`
    counts examples whose agent or guide raised."""

    mean: float | None
    std: float | None
    n: int
    n_failed: int
    scores: list[float | None]
    outputs: list[Any]
    # A 95% interval of `mean` (Wilson's for 0/1 scores, else a seeded bootstrap over examples).
    interval: Interval | None = None
    rollouts: list[Rollout] = Field(default_factory=list, exclude=True, repr=False)

    @classmethod
    def from_rollouts(cls, rollouts: list[Rollout]) -> EvalResult:
        scores = [r.score for r in rollouts]
        judged = [s for s in scores if s is not None]
        return cls(
            mean=mean_score(rollouts),
            interval=score_interval(scores),
            std=float(np.std(judged)) if judged else None,
            n=len(rollouts),
            n_failed=sum(r.failed for r in rollouts),
            scores=scores,
            outputs=[r.output for r in rollouts],
            rollouts=rollouts,
        )


class FinalCheckResult(BaseModel):
    """How the values `train()` returned were checked against the starting values
    (`opto.search.FinalCheck`).

    `kind` is "held-out" (examples reserved before the run, which no decision used),
    "repeated rollouts" (too little data to reserve any: the agent run again on the
    training examples, `repeats` times each where it is noisy) or "not run" (the run
    stopped before it could check: then the start is returned). `p_value` is the one-sided
    paired test of "the search's final values are no better than the start" at `alpha`,
    `difference` the mean per-example difference with its 95% `interval`.
    `returned` says which values `train()` gave back: "final" (shown better), "fallback"
    (the run's best validated values, shown better at `alpha / 2`, when the final were
    not) or "start". `search_score` is the final values' score on the examples the search
    decided on, `gap` that minus `final_score`: how much of the search's measured gain did
    not hold on the check. `search_parameters` are the values the search ended with,
    kept whatever was returned; `parameters` the values returned.

    `evidence` says whose evidence the check read: "held out" (reserved examples),
    "fresh rollouts" (the search's examples run again by a noisy agent or judge: new
    draws) or "reused" (the search's examples run again by a deterministic agent: the
    same answers the search chose on). Reused evidence is tested at `level`, `alpha`
    divided by the `compared` candidates the search measured on those examples (a
    Bonferroni bound on having picked the luckiest of them); otherwise `level` is
    `alpha`. `min_gain` is the smallest mean gain (a share) the check could have shown
    at that level on its examples (every changed example won; any loss asks for more).
    """

    kind: str
    examples: int = 0
    example_ids: list[str] = Field(default_factory=list)
    repeats: int = 1
    excluded: dict[str, str] = Field(default_factory=dict)
    noisy: bool | None = None
    test: str | None = None
    alpha: float | None = None
    p_value: float | None = None
    difference: float | None = None
    interval: tuple[float, float] | None = None
    start_score: float | None = None
    final_score: float | None = None
    fallback: dict[str, Any] | None = None
    returned: str = "start"
    returned_score: float | None = None
    search_score: float | None = None
    gap: float | None = None
    reason: str = ""
    search_parameters: dict[str, Any] = Field(default_factory=dict)
    evidence: str | None = None
    compared: int = 1
    level: float | None = None
    min_gain: float | None = None
    # The values returned, and the step after which the check ran (a resumed run that
    # makes more steps checks again; one that makes none returns these).
    parameters: dict[str, Any] = Field(default_factory=dict)
    step: int = 0

    def summary(self) -> str:
        """One line: what was returned and on what evidence."""
        if self.kind == "not run":
            return f"final check not run: {self.reason}"
        shown = {"final": "the final values", "fallback": "the run's best validated values", "start": "the start"}
        if self.p_value is None:
            return f"final check ({self.kind}): {self.reason}"
        line = f"final check ({self.kind}, {self.examples} examples"
        line += f" x {self.repeats}" if self.repeats > 1 else ""
        line += f"): start {_pct(self.start_score)}, final {_pct(self.final_score)}"
        if self.difference is not None and self.interval is not None:
            line += (
                f", difference {self.difference * 100:+.1f} points [{self.interval[0] * 100:+.1f}, "
                f"{self.interval[1] * 100:+.1f}], p = {self.p_value:.3g}"
            )
        if self.evidence == "reused":
            line += f" at level {self.level:.2g} (alpha {self.alpha:g} / {self.compared} candidates: reused evidence)"
        line += f"; returned {shown.get(self.returned, self.returned)}"
        if self.returned == "start" and self.min_gain is not None:
            line += f" (the smallest gain it could show: {self.min_gain * 100:.1f} points)"
        if self.gap is not None:
            line += f"; the search measured {_pct(self.search_score)} on its own examples (gap {self.gap * 100:+.1f})"
        return line


def _pct(score: float | None) -> str:
    return "n/a" if score is None else f"{score * 100:.1f}%"


class TrainResult(BaseModel):
    """What a `train` call did: scores, decisions, usage and the final values.

    `test_scores` are `(step, mean)` pairs, step 0 being before any update;
    `test_intervals` their 95% intervals, {step: (low, high)} (`opto.core.stats.score_interval`).
    `stopped_reason` is None for a run that finished, else why it stopped early.
    `train_failed` counts each step's failed rollouts (the agent or guide raised), and
    `test_failed` each evaluation's, {step: count}: a failed rollout scores `min_score`
    (0.0 by default) in every mean, and these say how many there were.
    `final_check` says how `final_parameters` were checked against the starting values
    on examples no decision used (`FinalCheckResult`; None for a trainer without one).
    `diagnosis` says why nothing was accepted, or why a candidate that scored above the
    current values was rejected (what the rule needed and the option that changes it);
    None when there is nothing to explain. `best_rejected_win` is that decision's record.
    """

    train_scores: list[float | None] = Field(default_factory=list)
    test_scores: list[tuple[int, float | None]] = Field(default_factory=list)
    test_intervals: dict[int, tuple[float, float] | None] = Field(default_factory=dict)
    steps: int = 0
    accepted: int = 0
    rejected: int = 0
    no_update: int = 0
    usage: UsageStats = Field(default_factory=UsageStats)
    usage_by_model: dict[str, UsageStats] = Field(default_factory=dict)
    # Rollouts the run made (GEPA's metric calls; test-set evaluations are not counted).
    metric_calls: int = 0
    final_parameters: dict[str, Any] = Field(default_factory=dict)
    stopped_reason: str | None = None
    run_dir: str | None = None
    seconds: float = 0.0
    train_failed: list[int] = Field(default_factory=list)
    test_failed: dict[int, int] = Field(default_factory=dict)
    rejected_wins: int = 0
    best_rejected_win: dict[str, Any] | None = None
    diagnosis: str | None = None
    final_check: FinalCheckResult | None = None

    @property
    def initial_test_score(self) -> float | None:
        return self.test_scores[0][1] if self.test_scores else None

    @property
    def final_test_score(self) -> float | None:
        return self.test_scores[-1][1] if self.test_scores else None

    @property
    def initial_test_interval(self) -> tuple[float, float] | None:
        return self.test_intervals.get(self.test_scores[0][0]) if self.test_scores else None

    @property
    def final_test_interval(self) -> tuple[float, float] | None:
        return self.test_intervals.get(self.test_scores[-1][0]) if self.test_scores else None

    @property
    def initial_test_failed(self) -> int | None:
        """Failed examples of the first test evaluation (None: no test set)."""
        return self.test_failed.get(self.test_scores[0][0]) if self.test_scores else None

    @property
    def final_test_failed(self) -> int | None:
        """Failed examples of the last test evaluation (None: no test set)."""
        return self.test_failed.get(self.test_scores[-1][0]) if self.test_scores else None

    @property
    def cost_usd(self) -> float:
        return self.usage.cost_usd
