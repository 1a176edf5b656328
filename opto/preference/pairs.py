"""From turns to preference pairs (and to the best responses, for supervised data)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, Field

from ..errors import OptoValueError
from .turns import Turn, TurnCandidate

__all__ = ["BuilderStats", "PreferencePair", "PreferencePairBuilder", "SupervisedExample"]

logger = logging.getLogger(__name__)


class PreferencePair(BaseModel):
    """A prompt, a preferred (chosen) and a non-preferred (rejected) response.

    `reward` is the strength of the preference: the score difference when the builder's
    `reward_from_score_diff` is on, else 1.0.
    """

    turn_id: str
    source: str
    step: int
    example_id: str
    prompt: list[dict[str, Any]]
    chosen: str
    rejected: str
    chosen_score: float
    rejected_score: float
    reward: float
    chosen_ref: str = ""
    rejected_ref: str = ""
    tools: list[dict[str, Any]] | None = None

    @property
    def score_diff(self) -> float:
        return self.chosen_score - self.rejected_score


class SupervisedExample(BaseModel):
    """A prompt and the best response of its turn."""

    turn_id: str
    source: str
    step: int
    example_id: str
    prompt: list[dict[str, Any]]
    response: str
    score: float
    tools: list[dict[str, Any]] | None = None


class BuilderStats(BaseModel):
    """What the builder did, for the log and for `opto export`."""

    turns: int = 0
    candidates: int = 0
    pairs: int = 0
    turns_skipped_single_candidate: int = 0
    pairs_skipped_small_diff: int = 0
    pairs_cut_by_max: int = 0
    truncated_candidates: int = 0
    pairs_skipped_truncated: int = 0
    candidates_below_min_score: int = 0
    duplicate_candidates_merged: int = 0
    duplicate_pairs_removed: int = 0
    by_source: dict[str, int] = Field(default_factory=dict)

    def summary(self) -> str:
        parts = [
            f"{self.turns} turns",
            f"{self.candidates} candidates",
            f"{self.pairs} pairs",
            f"{self.turns_skipped_single_candidate} turns skipped (single candidate)",
            f"{self.pairs_skipped_small_diff} pairs skipped (score difference too small or a tie)",
        ]
        if self.pairs_cut_by_max:
            parts.append(f"{self.pairs_cut_by_max} pairs over max_pairs_per_turn")
        if self.truncated_candidates:
            parts.append(
                f"{self.truncated_candidates} truncated responses (cut at max_tokens; never chosen), "
                f"{self.pairs_skipped_truncated} pairs skipped for it"
            )
        if self.candidates_below_min_score:
            parts.append(f"{self.candidates_below_min_score} responses below min_score")
        if self.duplicate_candidates_merged:
            parts.append(f"{self.duplicate_candidates_merged} duplicate responses merged")
        if self.duplicate_pairs_removed:
            parts.append(f"{self.duplicate_pairs_removed} duplicate pairs removed")
        return ", ".join(parts)


class PreferencePairBuilder:
    """Turns scored candidates into preference pairs.

    Candidates are grouped by turn and sorted by score, best first.

    Args:
        exhaustive_pairs: every pair of candidates whose score difference is
            >= `min_score_diff` and > 0 (a tie never makes a pair), largest difference
            first; when False, only the best against the worst.
        min_score_diff: the smallest score difference that makes a pair.
        max_pairs_per_turn: keep at most this many pairs per turn (the largest
            differences); None keeps all.
        require_multiple_candidates: skip turns with a single candidate (they cannot
            make a pair); for `best_responses`, also require the best to beat another.
        reward_from_score_diff: a pair's `reward` is its score difference (else 1.0).
        deduplicate: merge identical responses within a turn (their mean score) and drop
            pairs identical to an earlier one (same prompt, chosen and rejected).

    `build` returns the pairs grouped by example (in the order examples first appear);
    `stats` holds the counts of the last call, which are also logged.
    """

    def __init__(
        self,
        *,
        exhaustive_pairs: bool = True,
        min_score_diff: float = 0.0,
        max_pairs_per_turn: int | None = None,
        require_multiple_candidates: bool = True,
        reward_from_score_diff: bool = True,
        deduplicate: bool = True,
    ) -> None:
        if min_score_diff < 0:
            raise OptoValueError(f"min_score_diff must be >= 0, got {min_score_diff}")
        if max_pairs_per_turn is not None and max_pairs_per_turn < 1:
            raise OptoValueError(f"max_pairs_per_turn must be >= 1 or None, got {max_pairs_per_turn}")
        self.exhaustive_pairs = exhaustive_pairs
        self.min_score_diff = min_score_diff
        self.max_pairs_per_turn = max_pairs_per_turn
        self.require_multiple_candidates = require_multiple_candidates
        self.reward_from_score_diff = reward_from_score_diff
        self.deduplicate = deduplicate
        self.stats = BuilderStats()

    # ------------------------------------------------------------------ pairs

    def build(self, turns: Iterable[Turn]) -> list[PreferencePair]:
        """Every pair the settings allow, grouped by example."""
        stats = self.stats = BuilderStats()
        pairs: list[PreferencePair] = []
        seen: set[str] = set()
        for turn in turns:
            ranked = self._ranked(turn, stats)
            if len(ranked) == 1:
                stats.turns_skipped_single_candidate += 1
            if len(ranked) < 2:
                continue
            for pair in self._pairs_of(turn, ranked, stats):
                if not self.deduplicate or _first_time([pair.prompt, pair.chosen, pair.rejected], seen, stats):
                    pairs.append(pair)
        return _finish(pairs, stats, "preference pairs")

    def _ranked(self, turn: Turn, stats: BuilderStats) -> list[TurnCandidate]:
        """The turn's candidates, merged and sorted best first ([] when nothing was scored)."""
        candidates = list(turn.candidates)
        if not candidates:
            return []  # nothing scored at all: not counted as a turn
        stats.turns += 1
        if self.deduplicate:
            merged = _merge_identical(candidates)
            stats.duplicate_candidates_merged += len(candidates) - len(merged)
            candidates = merged
        stats.candidates += len(candidates)
        stats.truncated_candidates += sum(c.truncated for c in candidates)
        # Stable sort: equal scores keep their recorded order.
        return sorted(candidates, key=lambda c: -c.score)

    def _pairs_of(self, turn: Turn, ranked: Sequence[TurnCandidate], stats: BuilderStats) -> list[PreferencePair]:
        if self.exhaustive_pairs:
            options = [(ranked[i], ranked[j]) for i in range(len(ranked)) for j in range(i + 1, len(ranked))]
        else:
            options = [(ranked[0], ranked[-1])]
        kept = []
        for chosen, rejected in options:
            if chosen.truncated:  # an incomplete reply must never be learnt as the better one
                stats.pairs_skipped_truncated += 1
                continue
            diff = chosen.score - rejected.score
            if diff <= 0 or diff < self.min_score_diff:
                stats.pairs_skipped_small_diff += 1
                continue
            kept.append((chosen, rejected))
        kept.sort(key=lambda pair: -(pair[0].score - pair[1].score))  # stable: ties keep rank order
        if self.max_pairs_per_turn is not None and len(kept) > self.max_pairs_per_turn:
            stats.pairs_cut_by_max += len(kept) - self.max_pairs_per_turn
            kept = kept[: self.max_pairs_per_turn]
        return [self._pair(turn, chosen, rejected) for chosen, rejected in kept]

    def _pair(self, turn: Turn, chosen: TurnCandidate, rejected: TurnCandidate) -> PreferencePair:
        diff = chosen.score - rejected.score
        return PreferencePair(
            turn_id=turn.turn_id,
            source=turn.source,
            step=turn.step,
            example_id=turn.example_id,
            prompt=turn.prompt,
            chosen=chosen.response,
            rejected=rejected.response,
            chosen_score=chosen.score,
            rejected_score=rejected.score,
            reward=diff if self.reward_from_score_diff else 1.0,
            chosen_ref=chosen.ref,
            rejected_ref=rejected.ref,
            tools=turn.tools,
        )

    # ------------------------------------------------------------------ supervised

    def best_responses(self, turns: Iterable[Turn], *, min_score: float | None = None) -> list[SupervisedExample]:
        """Supervised examples from the turns, grouped by example (for supervised fine-tuning).

        By default the best response of each turn. With `require_multiple_candidates`, a
        turn counts only when its best response beats another one by at least
        `min_score_diff` (and by more than 0), i.e. when it would make a preference pair;
        otherwise a single candidate is taken as it is.

        With `min_score`, every complete response scoring at least `min_score` instead,
        whether or not its turn had other candidates: one good reply is enough to learn from.
        """
        stats = self.stats = BuilderStats()
        examples: list[SupervisedExample] = []
        seen: set[str] = set()
        for turn in turns:
            ranked = self._ranked(turn, stats)
            if not ranked:
                continue
            complete = [c for c in ranked if not c.truncated]
            if not complete:
                stats.pairs_skipped_truncated += 1
                continue
            if min_score is not None:
                chosen = [c for c in complete if c.score >= min_score]
                stats.candidates_below_min_score += len(complete) - len(chosen)
            elif self._stands_out(complete[0], ranked, stats):
                chosen = complete[:1]
            else:
                continue
            for best in chosen:
                if self.deduplicate and not _first_time([turn.prompt, best.response], seen, stats):
                    continue
                examples.append(
                    SupervisedExample(
                        turn_id=turn.turn_id,
                        source=turn.source,
                        step=turn.step,
                        example_id=turn.example_id,
                        prompt=turn.prompt,
                        response=best.response,
                        score=best.score,
                        tools=turn.tools,
                    )
                )
        return _finish(examples, stats, "best responses")

    def _stands_out(self, best: TurnCandidate, ranked: Sequence[TurnCandidate], stats: BuilderStats) -> bool:
        """Whether a turn's best response may be learnt alone (see `require_multiple_candidates`)."""
        if not self.require_multiple_candidates:
            return True
        if len(ranked) < 2:
            stats.turns_skipped_single_candidate += 1
            return False
        diff = best.score - ranked[-1].score
        if diff <= 0 or diff < self.min_score_diff:
            stats.pairs_skipped_small_diff += 1
            return False
        return True


def _first_time(parts: list[Any], seen: set[str], stats: BuilderStats) -> bool:
    """Whether an item is new; a repeat is counted as removed."""
    key = json.dumps(parts, ensure_ascii=False)
    if key in seen:
        stats.duplicate_pairs_removed += 1
        return False
    seen.add(key)
    return True


def _finish(items: list[Any], stats: BuilderStats, label: str) -> list[Any]:
    """Group by example, count by source, log the builder's figures."""
    items = _group_by_example(items)
    stats.pairs = len(items)
    for item in items:
        stats.by_source[item.source] = stats.by_source.get(item.source, 0) + 1
    logger.info("%s: %s", label, stats.summary())
    return items


def _merge_identical(candidates: Sequence[TurnCandidate]) -> list[TurnCandidate]:
    """One candidate per distinct response, scored with the mean of its scores."""
    groups: dict[str, list[TurnCandidate]] = {}
    for candidate in candidates:
        groups.setdefault(candidate.response, []).append(candidate)
    return [
        group[0]
        if len(group) == 1
        else TurnCandidate(
            response=group[0].response,
            score=sum(c.score for c in group) / len(group),
            ref=",".join(c.ref for c in group),
            truncated=any(c.truncated for c in group),
        )
        for group in groups.values()
    ]


def _group_by_example(items: list[Any]) -> list[Any]:
    """Items of the same example next to each other, examples in order of first appearance."""
    order: dict[str, int] = {}
    for item in items:
        order.setdefault(item.example_id, len(order))
    return sorted(items, key=lambda item: order[item.example_id])  # stable within an example
