"""Validation policies: decide whether a candidate update is accepted."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from .._util.files import json_key
from ..core.agent import Agent
from ..core.data import Example, load_dataset
from ..core.guides import Guide
from ..core.rollout import Rollout, mean_score
from ..core.stats import holm, paired_test
from ..errors import OptoValueError
from ..executors.local import AsyncioExecutor, RolloutExecutor
from .copies import CopyGuard
from .registry import make, names

__all__ = [
    "Decision",
    "DatasetValidation",
    "MinibatchFirst",
    "MinibatchValidation",
    "NoValidation",
    "Validation",
    "by_score",
    "make_validation",
]


class Decision(BaseModel):
    """The verdict on one candidate, with the scores it was based on."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    candidate_id: str
    accepted: bool
    current_score: float | None = None
    candidate_score: float | None = None
    reason: str = ""
    # MinibatchFirst: "minibatch" when the batch alone decided (a rejection), "dataset" when
    # the candidate went on to the validation set; "race" when a race dropped it part-way.
    # `rollouts_saved` counts the validation rollouts such a rejection did not need.
    stage: str | None = None
    rollouts_saved: int = 0
    rollouts: list[Rollout] = Field(default_factory=list, exclude=True, repr=False)
    current_rollouts: list[Rollout] = Field(default_factory=list, exclude=True, repr=False)
    # The candidate's rollouts on the step's batch when it was screened there first.
    screening_rollouts: list[Rollout] = Field(default_factory=list, exclude=True, repr=False)
    # With `alpha`: the paired test of "not better" on the examples both were scored on.
    test: str | None = None
    p_value: float | None = None
    difference: float | None = None
    difference_interval: tuple[float, float] | None = None
    # The examples the candidate won and lost against the current values (both scored),
    # and the level the rule tested at: what `opto.trainer.diagnosis` explains a rejection by.
    wins: int | None = None
    losses: int | None = None
    alpha: float | None = None
    # Examples left out of the comparison because the candidate or the current values quote
    # them ({id: what is quoted}; `opto.search.copies`).
    quoted: dict[str, str] = Field(default_factory=dict)
    # Before the test: whether the candidate won, and on how many paired examples (for a
    # step's second look at its best candidate, `MinibatchValidation.across_candidates`).
    _won: bool = PrivateAttr(default=False)
    _pairs: int = PrivateAttr(default=0)


class ValidationContext(BaseModel):
    """What a policy may use: the agent and guide, the step's batch and its rollouts."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    agent: Agent
    guide: Guide
    batch: list[Example]
    current_rollouts: list[Rollout]
    min_score: float | None = None
    executor: RolloutExecutor = Field(default_factory=AsyncioExecutor)
    improvement_threshold: float = 0.0
    rollout_timeout: float | None = None
    guard: CopyGuard | None = None

    def quoted(self, update: dict[Any, Any]) -> dict[str, str]:
        """The examples the current values or the candidate (the current values with
        `update`) quote, which neither gets credit for."""
        if self.guard is None:
            return {}
        current = self.agent.stored_values(trainable_only=True)
        values = {**current, **{getattr(k, "name", k): v for k, v in update.items()}}
        return {**self.guard.quoted(current), **self.guard.quoted(values)}

    async def run(
        self,
        examples: Sequence[Example],
        update: dict[Any, Any] | None,
        on_result: Callable[[Rollout], None] | None = None,
    ) -> list[Rollout]:
        """`examples` under the current values with `update` (None: as they are), on the
        step's executor and settings; `on_result` sees each rollout as it finishes."""
        return await self.executor.run(
            self.agent,
            self.guide,
            examples,
            values=update,
            min_score=self.min_score,
            timeout=self.rollout_timeout,
            on_result=on_result,
        )


class Validation:
    """Base class: `decide` scores a candidate update against the current values."""

    name = "custom"

    async def decide(self, ctx: ValidationContext, candidate_id: str, update: dict[Any, Any]) -> Decision:
        raise NotImplementedError

    def rollouts_per_step(self, batch_size: int, candidates: int) -> int:
        """The fewest agent runs this policy makes in one step (for the budget check)."""
        return 0

    def most_rollouts_per_step(self, batch_size: int, candidates: int) -> int:
        """The most agent runs this policy makes in one step on a deterministic agent (the
        estimate's upper end; a noisy agent's repeats come on top)."""
        return self.rollouts_per_step(batch_size, candidates)

    def reset(self) -> None:
        """Forget what was measured in an earlier run (called when a run starts)."""

    def set_noise(self, repeats: int) -> None:
        """The agent or judge is noisy (two runs of the same values disagreed): measure a
        candidate that won, and the current values, up to `repeats` times (1: not noisy)."""

    def take_current_rollouts(self) -> list[Rollout]:
        """The current values' rollouts this policy measured since it was last asked (the
        trainer writes them to the ledger: every paid rollout is on the record)."""
        return []

    def take_cut_short(self) -> list[tuple[str, str, list[Rollout]]]:
        """(phase, candidate id, rollouts) a stop cut short inside `decide` since this was
        last asked: finished and paid, with no decision to carry them to the ledger."""
        taken, self._cut = getattr(self, "_cut", []), []
        return taken

    def _note_cut(self, phase: str, candidate_id: str, rollouts: list[Rollout]) -> None:
        if rollouts:
            self._cut = [*getattr(self, "_cut", []), (phase, candidate_id, list(rollouts))]

    def across_candidates(self, decisions: list[Decision]) -> list[Decision]:
        """The step's decisions once all its candidates are judged: with `alpha` and several
        tested candidates, only the acceptances that survive Holm's correction."""
        return holm_corrected(decisions, self.alpha)

    alpha: float | None = None
    accept_ties: bool = False
    _cut: list[tuple[str, str, list[Rollout]]]  # set by `_note_cut`: rollouts a stop left without a decision

    def compare(
        self,
        candidate_id: str,
        current: Sequence[Rollout],
        candidate: Sequence[Rollout],
        threshold: float,
        quoted: dict[str, str] | None = None,
    ) -> Decision:
        """Accept only a strict improvement over current + threshold (a tie is rejected,
        unless `accept_ties`);
        with `alpha`, also only one that a one-sided paired test finds significant
        (`opto.core.stats.paired_test`: the exact sign test for 0/1 scores, a paired bootstrap
        for graded ones).

        A candidate under which more examples fail (the agent or guide raised) is
        rejected whatever its mean: with `min_score=None` failures are left out of
        means, and a candidate must not win by breaking the examples it cannot do.

        The examples in `quoted` (copied into the values compared) count for neither.
        """
        if quoted:
            current = [r for r in current if r.example_id not in quoted]
            candidate = [r for r in candidate if r.example_id not in quoted]
        current_score, candidate_score = mean_score(current), mean_score(candidate)
        current_failed, candidate_failed = sum(r.failed for r in current), sum(r.failed for r in candidate)
        if candidate_failed > current_failed:
            reason, accepted = (
                f"the candidate failed on {candidate_failed} examples, the current values on {current_failed}",
                False,
            )
        elif candidate_score is None:
            reason, accepted = "the candidate could not be scored", False
        elif current_score is None:
            reason, accepted = "the current values could not be scored; the scored candidate wins", True
        else:
            accepted = candidate_score > current_score + threshold or (
                self.accept_ties and candidate_score == current_score + threshold
            )
            relation = (">=" if candidate_score == current_score + threshold else ">") if accepted else "<="
            reason = f"{candidate_score:.4f} {relation} {current_score:.4f} + {threshold}"
        pairs = _paired_scores(current, candidate)
        decision = Decision(
            candidate_id=candidate_id,
            accepted=accepted,
            current_score=current_score,
            candidate_score=candidate_score,
            reason=reason,
            rollouts=list(candidate),
            current_rollouts=list(current),
            wins=sum(b > a for a, b in pairs),
            losses=sum(b < a for a, b in pairs),
            alpha=self.alpha,
            quoted=dict(quoted or {}),
        )
        return self._significance(decision, pairs) if self.alpha is not None and pairs else decision

    def _significance(self, decision: Decision, pairs: list[tuple[float, float]]) -> Decision:
        """The decision with the paired test's verdict: a win that is not significant is rejected."""
        found = paired_test([a for a, _ in pairs], [b for _, b in pairs])
        significant = found.p_value <= self.alpha  # type: ignore[operator]
        verdict = (
            f"{found.test}: p = {found.p_value:.3g} {'<=' if significant else '>'} alpha = {self.alpha:g}, "
            f"difference {found.difference:+.3f} [{found.interval.low:+.3f}, {found.interval.high:+.3f}]"
        )
        return decision.model_copy(
            update={
                "accepted": decision.accepted and significant,
                "reason": f"{decision.reason}; {verdict}",
                "test": found.test,
                "p_value": found.p_value,
                "difference": found.difference,
                "difference_interval": (found.interval.low, found.interval.high),
            }
        )


class NoValidation(Validation):
    """Accept every candidate."""

    name = "none"

    async def decide(self, ctx: ValidationContext, candidate_id: str, update: dict[Any, Any]) -> Decision:
        return Decision(
            candidate_id=candidate_id,
            accepted=True,
            current_score=mean_score(ctx.current_rollouts),
            reason="validation='none' accepts every candidate",
        )


class MinibatchValidation(Validation):
    """Re-run the step's batch with the candidate; the current scores are reused.

    `alpha`: None accepts any strict win; a level (e.g. 0.1) accepts only a win that a
    one-sided paired test on the batch finds significant at that level. A batch too small
    for the test ever to reach `alpha` (n examples, 0.5**n > alpha: fewer than 4 at 0.1)
    is judged by the strict win alone, and the decision's reason says so: a last short
    batch of an epoch, or batches of 2, must not make acceptance impossible.

    With several candidates in a step, only the one that scored best on the batch is
    tested (ties go to the earlier candidate, the aggregator's merge before single
    proposals), at `alpha` divided by the number of candidates (Bonferroni: a step's chance
    of keeping a candidate that is not better stays near `alpha`), but never at a level
    stricter than a clean sweep of the batch can pass (0.5**n on n examples). So a
    candidate right on every example of its batch where the current values were wrong is
    accepted at any batch size and with any number of candidates; with Holm's correction
    alone, two candidates on a batch of 4 could never pass (1/16 > 0.05). The others are
    rejected, and each decision's reason says how the step chose.
    """

    name = "minibatch"

    def __init__(self, alpha: float | None = None) -> None:
        self.alpha = check_alpha(alpha)

    def rollouts_per_step(self, batch_size: int, candidates: int) -> int:
        return batch_size * candidates

    def _significance(self, decision: Decision, pairs: list[tuple[float, float]]) -> Decision:
        if self.alpha is not None and 0.5 ** len(pairs) > self.alpha:
            note = (
                f"a batch of {len(pairs)} is too small for the paired test to reach alpha = {self.alpha:g} "
                "(a strict win decides)"
            )
            return decision.model_copy(update={"reason": f"{decision.reason}; {note}"})
        tested = super()._significance(decision, pairs)
        tested._won, tested._pairs = decision.accepted, len(pairs)
        return tested

    def across_candidates(self, decisions: list[Decision]) -> list[Decision]:
        """Test only the best candidate on the batch, at the step's level; reject the others."""
        if len(decisions) < 2:
            return decisions
        best = max(range(len(decisions)), key=lambda i: (by_score(decisions[i]), -i))
        chosen = decisions[best]
        found = []
        for index, decision in enumerate(decisions):
            if index == best:
                found.append(self._tested_as_the_best(decision, len(decisions)))
                continue
            note = (
                f"not the step's choice: {chosen.candidate_id} scored {_fmt(chosen.candidate_score)} on the batch "
                f"against {_fmt(decision.candidate_score)}, and only the best candidate is tested"
            )
            found.append(decision.model_copy(update={"accepted": False, "reason": f"{decision.reason}; {note}"}))
        return found

    def _tested_as_the_best(self, decision: Decision, candidates: int) -> Decision:
        """The step's chosen candidate, its test redone at alpha / candidates (or the clean
        sweep's level, if higher)."""
        note = f"chosen as the best on the batch of {candidates} candidates, the only one tested"
        if self.alpha is None or decision.p_value is None:
            return decision.model_copy(update={"reason": f"{decision.reason}; {note}"})
        level = max(self.alpha / candidates, 0.5**decision._pairs)
        passed = decision.p_value <= level
        note += (
            f", at alpha/{candidates} or a clean sweep's 1/2^{decision._pairs}, whichever is higher: "
            f"p = {decision.p_value:.3g} {'<=' if passed else '>'} {level:.3g}"
        )
        return decision.model_copy(
            update={"accepted": decision._won and passed, "alpha": level, "reason": f"{decision.reason}; {note}"}
        )

    async def decide(self, ctx: ValidationContext, candidate_id: str, update: dict[Any, Any]) -> Decision:
        finished: list[Rollout] = []
        try:
            rollouts = await ctx.run(ctx.batch, update, finished.append)
        except BaseException:
            self._note_cut("validation", candidate_id, finished)
            raise
        return self.compare(candidate_id, ctx.current_rollouts, rollouts, ctx.improvement_threshold, ctx.quoted(update))


class DatasetValidation(Validation):
    """Compare candidate and current values on a fixed validation dataset.

    `alpha`: None accepts any strict win; a level (e.g. 0.05) accepts only a win that a
    one-sided paired test on the validation examples finds significant (with several
    candidates in a step, after Holm's correction for their number).

    The current values' score is computed once per distinct set of values and reused,
    also by candidates validated at the same time.

    `accept_ties`: also accept a candidate that scores exactly as the current values on
    the whole set. On a small set a tie often hides a real gain (the examples it would win
    were answered right by luck), and moving on lets the search leave a plateau.

    `race`: validate a candidate in chunks of this many examples (in an order drawn from
    the update itself, so a resumed run draws the same) and stop as soon as it has lost
    `behind` more examples than it won against the current values: most candidates are
    worse, and each one dropped early saves the rest of the set. A dropped candidate is
    rejected with `stage: "race"` and the rollouts it saved in `rollouts_saved`.
    """

    name = "dataset"

    def __init__(
        self,
        dataset: Any,
        alpha: float | None = None,
        *,
        race: int | None = None,
        behind: int = 1,
        accept_ties: bool = False,
    ) -> None:
        self.alpha = check_alpha(alpha)
        self.accept_ties = accept_ties
        self.examples: list[Example] = load_dataset(dataset)
        if race is not None and (isinstance(race, bool) or not isinstance(race, int) or race < 1):
            raise OptoValueError(f"race must be a chunk size >= 1 or None, got {race!r}")
        if isinstance(behind, bool) or not isinstance(behind, int) or behind < 1:
            raise OptoValueError(f"behind must be an int >= 1, got {behind!r}")
        self.race = race
        self.behind = behind
        self._current: dict[str, asyncio.Future[list[Rollout]]] = {}
        self._measured: dict[str, int] = {}  # measurements pooled in `_current`, per set of values
        self._unrecorded: list[Rollout] = []  # the current values' rollouts not yet in the ledger
        self.repeats = 1

    def rollouts_per_step(self, batch_size: int, candidates: int) -> int:
        return len(self.examples) * (candidates + 1)  # the current values' too, the first time

    def reset(self) -> None:
        self._current, self._measured = {}, {}  # another run may have another agent model
        self._unrecorded = []
        self.repeats = 1

    def take_current_rollouts(self) -> list[Rollout]:
        taken = list(self._unrecorded)
        self._unrecorded.clear()  # in place: a measurement still running appends to this list
        return taken

    def set_noise(self, repeats: int) -> None:
        self.repeats = repeats

    def _current_rollouts(self, ctx: ValidationContext) -> asyncio.Future[list[Rollout]]:
        """The current values' rollouts on the set: measured once, and on a noisy agent or
        judge measured again by later decisions (up to `repeats` times) and pooled."""
        key = json_key({p.name: p.value for p in ctx.agent.parameters()})
        cached = self._current.get(key)
        broken = cached is not None and (cached.cancelled() or (cached.done() and cached.exception() is not None))
        if cached is None or broken:
            self._measured[key] = 1
            cached = self._current[key] = asyncio.ensure_future(self._run(ctx, None))
        elif self._measured[key] < self.repeats:
            self._measured[key] += 1
            cached = self._current[key] = asyncio.ensure_future(self._more(ctx, cached))
        return cached

    async def _run(
        self, ctx: ValidationContext, update: dict[Any, Any] | None, on_result: Callable[[Rollout], None] | None = None
    ) -> list[Rollout]:
        """The set under `update` (None: the current values, each of whose rollouts is kept
        for the ledger as it finishes)."""
        return await ctx.run(self.examples, update, self._unrecorded.append if update is None else on_result)

    async def _more(self, ctx: ValidationContext, earlier: asyncio.Future[list[Rollout]]) -> list[Rollout]:
        return [*await asyncio.shield(earlier), *await self._run(ctx, None)]

    async def decide(self, ctx: ValidationContext, candidate_id: str, update: dict[Any, Any]) -> Decision:
        cached = self._current_rollouts(ctx)
        if self.race is None:
            finished: list[Rollout] = []
            try:
                rollouts = await self._run(ctx, update, finished.append)
            except BaseException:
                self._note_cut("validation", candidate_id, finished)
                raise
            current = _pooled(await asyncio.shield(cached))
            decision = self.compare(candidate_id, current, rollouts, ctx.improvement_threshold, ctx.quoted(update))
        else:
            decision = await self._race(ctx, candidate_id, update, cached)
        return await self._confirmed(ctx, decision, update, cached)

    async def _confirmed(
        self, ctx: ValidationContext, decision: Decision, update: dict[Any, Any], cached: asyncio.Future[list[Rollout]]
    ) -> Decision:
        """On a noisy agent or judge, a candidate that won is measured `repeats - 1` more
        times and judged again on its pooled scores against the current values' pooled
        scores: one lucky measurement is not evidence."""
        if self.repeats < 2 or not decision.accepted:
            return decision
        rollouts = list(decision.rollouts)
        for _ in range(self.repeats - 1):
            rollouts += await self._run(ctx, update)
        current = _pooled(await asyncio.shield(cached))
        again = self.compare(
            decision.candidate_id, current, _pooled(rollouts), ctx.improvement_threshold, ctx.quoted(update)
        )
        note = f"measured {self.repeats} times (a noisy agent or judge): {again.reason}"
        return again.model_copy(update={"rollouts": rollouts, "stage": decision.stage, "reason": note})

    async def _race(
        self, ctx: ValidationContext, candidate_id: str, update: dict[Any, Any], cached: asyncio.Future[list[Rollout]]
    ) -> Decision:
        """Validate chunk by chunk; drop the candidate once it is `behind` examples behind."""
        order = list(self.examples)
        random.Random(json_key({getattr(k, "name", k): v for k, v in update.items()})).shuffle(order)
        quoted = ctx.quoted(update)
        current = {r.example_id: r for r in _pooled(await asyncio.shield(cached))}
        done: list[Rollout] = []
        race = self.race or len(order)
        for start in range(0, len(order), race):
            finished: list[Rollout] = []
            try:
                done += await ctx.run(order[start : start + race], update, finished.append)
            except BaseException:
                self._note_cut("validation", candidate_id, [*done, *finished])
                raise
            lost = sum(_sign(current[r.example_id].score, r.score) for r in done if r.example_id not in quoted)
            if lost >= self.behind and len(done) < len(order):
                before = [current[r.example_id] for r in done]
                decision = self.compare(candidate_id, before, done, ctx.improvement_threshold, quoted)
                return decision.model_copy(
                    update={
                        "accepted": False,
                        "stage": "race",
                        "rollouts_saved": len(order) - len(done),
                        "reason": f"dropped after {len(done)} of {len(order)} examples: {lost} more lost than won",
                    }
                )
        return self.compare(candidate_id, list(current.values()), done, ctx.improvement_threshold, quoted)


def _pooled(rollouts: Sequence[Rollout]) -> list[Rollout]:
    """One rollout per example, its score the mean of that example's scored rollouts (the
    first rollout stands for the rest; an example none of whose rollouts was scored keeps
    its first as it is)."""
    by_example: dict[str, list[Rollout]] = {}
    for rollout in rollouts:
        by_example.setdefault(rollout.example_id, []).append(rollout)
    if all(len(found) == 1 for found in by_example.values()):
        return list(rollouts)
    pooled = []
    for found in by_example.values():
        scores = [r.score for r in found if r.score is not None]
        pooled.append(found[0].model_copy(update={"score": sum(scores) / len(scores)}) if scores else found[0])
    return pooled


class MinibatchFirst(DatasetValidation):
    """Screen a candidate on the step's batch first; validate on the dataset only one that
    beats the current values there.

    Most candidates lose on the batch they were proposed for, and each such loss saves a
    whole validation run (GEPA's acceptance). The batch comparison is the minibatch rule
    (a strict win by more than `improvement_threshold`); the dataset decides the rest.
    Works with `selection="pareto"`: only candidates that reach the dataset join the pool.
    """

    name = "minibatch_first"

    def rollouts_per_step(self, batch_size: int, candidates: int) -> int:
        return batch_size * candidates  # a candidate that loses on the batch costs no more

    def most_rollouts_per_step(self, batch_size: int, candidates: int) -> int:
        return batch_size * candidates + super().rollouts_per_step(batch_size, candidates)  # every one screened in

    async def decide(self, ctx: ValidationContext, candidate_id: str, update: dict[Any, Any]) -> Decision:
        finished: list[Rollout] = []
        try:
            return await self._screened(ctx, candidate_id, update, finished)
        except BaseException:
            self._note_cut("screening", candidate_id, finished)  # a stop: the screen's rollouts stay on record
            raise

    async def _screened(
        self, ctx: ValidationContext, candidate_id: str, update: dict[Any, Any], finished: list[Rollout]
    ) -> Decision:
        screened = await ctx.run(ctx.batch, update, finished.append)
        first = MinibatchValidation().compare(
            candidate_id, ctx.current_rollouts, screened, ctx.improvement_threshold, ctx.quoted(update)
        )  # the screen: any strict win goes on
        if not first.accepted:
            return first.model_copy(
                update={
                    "stage": "minibatch",
                    "rollouts_saved": len(self.examples),
                    "rollouts": [],
                    "screening_rollouts": screened,
                    "reason": f"on the batch: {first.reason}; not validated on the dataset",
                }
            )
        full = await super().decide(ctx, candidate_id, update)
        return full.model_copy(
            update={
                "stage": full.stage or "dataset",
                "screening_rollouts": screened,
                "reason": f"on the batch: {first.reason}; on the dataset: {full.reason}",
            }
        )


def _paired_scores(current: Sequence[Rollout], candidate: Sequence[Rollout]) -> list[tuple[float, float]]:
    """(current, candidate) scores of the examples both were scored on."""
    before = {r.example_id: r.score for r in current}
    return [
        (before[r.example_id], r.score)  # type: ignore[misc]
        for r in candidate
        if r.score is not None and before.get(r.example_id) is not None
    ]


def by_score(decision: Decision) -> float:
    """Sort key: the candidate's score, unscored last."""
    return float("-inf") if decision.candidate_score is None else decision.candidate_score


def _fmt(score: float | None) -> str:
    return "n/a" if score is None else f"{score:.3f}"


def _sign(before: float | None, after: float | None) -> int:
    """+1 where the candidate lost an example, -1 where it won, 0 for a tie (or no score)."""
    if before is None or after is None or before == after:
        return 0
    return 1 if after < before else -1


def holm_corrected(decisions: list[Decision], alpha: float | None) -> list[Decision]:
    """With several tested candidates in one step, keep only the acceptances that survive
    Holm's correction for their number (a family-wise level of `alpha`)."""
    tested = [i for i, d in enumerate(decisions) if d.p_value is not None]
    if alpha is None or len(tested) < 2:
        return decisions
    keep = holm([decisions[i].p_value for i in tested], alpha)  # type: ignore[misc]
    found = list(decisions)
    for index, survives in zip(tested, keep):
        if found[index].accepted and not survives:
            found[index] = found[index].model_copy(
                update={
                    "accepted": False,
                    "reason": f"{found[index].reason}; not significant after Holm's correction for {len(tested)} candidates",
                }
            )
    return found


def check_alpha(alpha: float | None) -> float | None:
    if alpha is not None and not (isinstance(alpha, (int, float)) and 0 < alpha < 1):
        raise OptoValueError(f"alpha must be a significance level in (0, 1), e.g. 0.05, or None; got {alpha!r}")
    return alpha


def make_validation(spec: str | Validation | Sequence[Any] | Any) -> Validation:
    """A registered name ("minibatch", "none"; `opto.search.registry`), a `Validation`, or
    a dataset (anything `load_dataset` reads, such as a ".jsonl" path): `DatasetValidation`
    on it (`AggregatedUpdate` makes a greedy search's dataset a `MinibatchFirst`)."""
    if isinstance(spec, Validation):
        return spec
    if isinstance(spec, str) and not spec.endswith(".jsonl"):
        if spec not in names("validation"):
            known = ", ".join(repr(name) for name in names("validation"))
            raise OptoValueError(f"validation must be one of {known}, a dataset or a Validation; got {spec!r}")
        return make("validation", spec)
    return DatasetValidation(spec)
