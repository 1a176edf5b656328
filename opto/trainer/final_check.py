"""The run's last phase: the values `train()` returns are checked against the start.

`check_final_values` runs the start, the search's final values and (when those fail)
the run's best validated values on the check's examples, pairs them example by example
and returns the first that a one-sided paired test shows better than the start (the
start itself when none is). `probe_noise` finds out before the first step whether the
agent or judge is noisy: the same values run twice on the same examples disagree.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from ..core.agent import Agent
from ..core.data import Example
from ..core.guides import Guide
from ..core.rollout import Rollout, digest_of
from ..core.stats import paired_test, sign_test_mid_p, smallest_shown_gain
from ..executors.local import RolloutExecutor
from ..run.results import FinalCheckResult
from ..search.copies import CopyGuard
from ..search.final_check import FinalCheck

__all__ = ["NoiseProbe", "Runner", "check_final_values", "not_run", "probe_noise"]

logger = logging.getLogger(__name__)


class NoiseProbe(BaseModel):
    """Two runs of the starting values on the same examples: `noisy` when any disagreed."""

    examples: int
    disagreed: int

    @property
    def noisy(self) -> bool:
        return self.disagreed > 0


class Runner(BaseModel):
    """What running values on examples needs."""

    model_config = {"arbitrary_types_allowed": True}

    agent: Agent
    guide: Guide
    executor: RolloutExecutor
    min_score: float | None = None
    timeout: float | None = None

    def digest(self, values: dict[str, Any]) -> str:
        """The digest a rollout under `values` records (`Rollout.values_hash`): the
        trainable ones."""
        trainable = {p.name for p in self.agent.parameters(trainable_only=True)}
        return digest_of({name: value for name, value in values.items() if name in trainable})

    async def run(
        self,
        examples: Sequence[Example],
        values: dict[str, Any] | None,
        on_result: Callable[[Rollout], None] | None = None,
    ) -> list[Rollout]:
        resolved = self.agent.resolve(values) if values else None
        return await self.executor.run(
            self.agent,
            self.guide,
            list(examples),
            values=resolved,
            min_score=self.min_score,
            timeout=self.timeout,
            on_result=on_result,
        )


async def probe_noise(runner: Runner, examples: Sequence[Example]) -> tuple[NoiseProbe, list[Rollout]]:
    """Run the current values twice on `examples`; count the examples whose scores differ."""
    if not examples:  # FinalCheck(probe=0): no probe, the agent taken as deterministic
        return NoiseProbe(examples=0, disagreed=0), []
    rollouts = await runner.run([*examples, *examples], None)
    first, second = rollouts[: len(examples)], rollouts[len(examples) :]
    disagreed = sum(a.score != b.score for a, b in zip(first, second))
    return NoiseProbe(examples=len(examples), disagreed=disagreed), rollouts


#: Below this level a paired bootstrap's p (2,000 draws: never under 1/2,001) cannot
#: pass; the check then decides on each example's sign of difference (the mid-p sign test).
FINEST_BOOTSTRAP_LEVEL = 0.01


def _per_example(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Each example's mean score over its rollouts (unscored rollouts left out)."""
    scores: dict[str, list[float]] = defaultdict(list)
    for rollout in rollouts:
        if rollout.score is not None:
            scores[rollout.example_id].append(rollout.score)
    return {key: sum(found) / len(found) for key, found in scores.items()}


class _Measured:
    """The rollouts of each set of values on the check's examples, in rounds (a round runs
    every example once), so a second look adds rounds instead of starting over.

    With `recorded` (a deterministic agent: {values digest: {example id: score}} of what the
    search measured), a first look reads those scores and runs only the examples they
    lack: running them again would give the same answers at a price. With `allowance`
    (what a metric-call limit leaves a check that kept no calls), no more rollouts than
    that are run, and the test compares what both sides have."""

    def __init__(
        self,
        runner: Runner,
        examples: Sequence[Example],
        on_made: Callable[[list[Rollout]], None] | None = None,
        recorded: Mapping[str, Mapping[str, float]] | None = None,
        allowance: int | None = None,
    ) -> None:
        self.runner, self.examples, self.on_made = runner, list(examples), on_made
        self.recorded, self.allowance = recorded, allowance
        self.rounds: dict[str, list[Rollout]] = defaultdict(list)
        self.made: list[Rollout] = []

    async def scores(self, values: dict[str, Any], rounds: int, partner: Collection[str] = ()) -> dict[str, float]:
        """Each example's mean score over `rounds` rounds of `values` (run as needed; under
        an allowance, the examples in `partner`, those the other side has, first)."""
        key = self.runner.digest(values)
        if self.recorded is not None and rounds == 1:
            return await self._completed(key, values, partner)
        have = len(self.rounds[key]) // max(1, len(self.examples))
        if rounds > have:
            await self._run([e for _ in range(rounds - have) for e in self.examples], key, values)
        return _per_example(self.rounds[key])

    def known(self, values: dict[str, Any]) -> set[str]:
        """The examples whose scores of `values` the search recorded."""
        return set((self.recorded or {}).get(self.runner.digest(values), {}))

    async def _completed(self, key: str, values: dict[str, Any], partner: Collection[str]) -> dict[str, float]:
        """The search's scores of `values` on the check's examples, the missing ones run
        (those the other side has first: a score only one side has compares nothing)."""
        wanted = {e.id for e in self.examples}
        found = {i: score for i, score in (self.recorded or {}).get(key, {}).items() if i in wanted}
        ran = _per_example(self.rounds[key])
        missing = [e for e in self.examples if e.id not in found and e.id not in ran]
        missing.sort(key=lambda e: e.id not in partner)  # stable: the examples' order otherwise
        if missing:
            await self._run(missing, key, values)
        return {**found, **_per_example(self.rounds[key])}

    async def _run(self, examples: list[Example], key: str, values: dict[str, Any]) -> None:
        if self.allowance is not None:
            examples = examples[: self.allowance]
            self.allowance -= len(examples)
        if not examples:
            return
        # Each rollout on the record as it finishes: a budget may stop the rest of the batch.
        report = self.on_made
        found = await self.runner.run(examples, values, None if report is None else lambda one: report([one]))
        self.rounds[key] += found
        self.made += found


async def _compare(
    measured: _Measured, start: dict[str, Any], values: dict[str, Any], level: float, repeats: int
) -> tuple[dict[str, Any], bool, int]:
    """The paired test of `values` against `start`: one round each, then (when `repeats` > 1
    and the first look is not conclusive either way) `repeats` rounds; each look at
    `level / 2` when there are two, so the two looks together stay at `level`."""
    looks = [1, repeats] if repeats > 1 else [1]
    each = level / len(looks)
    found: dict[str, Any] = {}
    for rounds in looks:
        before = await measured.scores(start, rounds, measured.known(values))
        after = await measured.scores(values, rounds, before)
        keys = [k for k in before if k in after]
        if not keys:
            return {}, False, rounds
        test = paired_test([before[k] for k in keys], [after[k] for k in keys])
        if test.test.startswith("exact sign test") or each < FINEST_BOOTSTRAP_LEVEL:
            test = test.model_copy(update=_mid_p(before, after, keys))
        found = {
            "test": test.test,
            "p_value": test.p_value,
            "difference": test.difference,
            "interval": (test.interval.low, test.interval.high),
            "start_score": sum(before[k] for k in keys) / len(keys),
            "score": sum(after[k] for k in keys) / len(keys),
            "alpha": level,
        }
        if test.difference > 0 and test.p_value <= each:
            return found, True, rounds
        if test.p_value >= 1 - level:  # the first look points the other way: a second would not pass
            return found, False, rounds
    return found, False, looks[-1]


async def check_final_values(
    runner: Runner,
    settings: FinalCheck,
    *,
    examples: Sequence[Example],
    kind: str,
    start: dict[str, Any],
    final: dict[str, Any],
    fallback: dict[str, Any] | None,
    noisy: bool,
    guard: CopyGuard | None,
    search_score: float | None,
    compared: int = 1,
    on_made: Callable[[list[Rollout]], None] | None = None,
    recorded: Mapping[str, Mapping[str, float]] | None = None,
    allowance: int | None = None,
) -> tuple[FinalCheckResult, dict[str, Any], list[Rollout]]:
    """The check's result, the values to return, and every rollout it made (each round
    also handed to `on_made` as soon as it is made).

    `compared`: the candidates the search measured on `examples`. Where those examples
    are not held out and the agent is deterministic (not `noisy`), running them again
    gives the very answers the search picked the final values on, so the test is held
    to `alpha / compared`: the chance that the luckiest of that many candidates, none
    truly better, passes stays within `alpha`. Such a check reads the search's own scores
    (`recorded`: {values digest: {example id: score}}) and runs only the examples they lack:
    the answers would be the same. `allowance`: the most rollouts the check may run
    (None: as many as it needs)."""
    candidates = [values for values in (final, fallback) if values is not None]
    excluded: dict[str, str] = {}
    if guard is not None:
        for values in (start, *candidates):
            excluded.update(guard.quoted(values))
    usable = [e for e in examples if (e.id or "") not in excluded]
    result = _opened(settings, kind, usable, excluded, noisy, compared, search_score, final)
    if final == start:
        return result.model_copy(update={"reason": "the search ended where it started"}), start, []
    if not usable:
        return (
            result.model_copy(update={"reason": "no example left to check on (the values quote every one)"}),
            start,
            [],
        )
    level, repeats = result.level or settings.alpha, result.repeats
    reuse = recorded if result.evidence == "reused" else None
    measured = _Measured(runner, usable, on_made, reuse, allowance)
    for index, values in enumerate(candidates):
        found, shown, rounds = await _compare(measured, start, values, level if index == 0 else level / 2, repeats)
        if not found:
            continue
        if index == 0:
            gap = None if search_score is None else search_score - found["score"]
            update = {k: v for k, v in found.items() if k not in ("score", "alpha")}
            result = result.model_copy(update={**update, "final_score": found["score"], "gap": gap, "repeats": rounds})
        else:
            result = result.model_copy(update={"fallback": {**found, "shown": shown, "repeats": rounds}})
        if shown:
            which = "final" if index == 0 else "best validated"
            reason = f"the {which} values are better than the start: p = {found['p_value']:.3g}"
            returned = "final" if index == 0 else "fallback"
            update = {"returned": returned, "returned_score": found["score"], "reason": reason}
            return result.model_copy(update=update), values, measured.made
    return _not_shown(result, level), start, measured.made


def _opened(
    settings: FinalCheck,
    kind: str,
    usable: list[Example],
    excluded: dict[str, str],
    noisy: bool,
    compared: int,
    search_score: float | None,
    final: dict[str, Any],
) -> FinalCheckResult:
    """The check's result before any look: whose evidence it reads, the level that sets,
    the rounds a noisy agent's second look takes, and the smallest gain it could show."""
    evidence = "held out" if kind in ("held-out", "unseen") else "fresh rollouts" if noisy else "reused"
    compared = max(1, compared) if evidence == "reused" else 1
    level = settings.alpha / compared
    repeats = settings.rounds(len(usable)) if noisy else 1
    first_look = level / 2 if repeats > 1 else level
    return FinalCheckResult(
        kind=kind,
        examples=len(usable),
        example_ids=[e.id or "" for e in usable],
        excluded=excluded,
        noisy=noisy,
        alpha=settings.alpha,
        repeats=repeats,
        search_score=search_score,
        search_parameters=dict(final),
        evidence=evidence,
        compared=compared,
        level=level,
        min_gain=smallest_shown_gain(len(usable), first_look) if usable else None,
    )


def _not_shown(result: FinalCheckResult, level: float) -> FinalCheckResult:
    """The start returned: neither the final values nor a fallback were shown better."""
    reason = (
        f"the final values are not shown better than the start (p = {result.p_value:.3g}, level {level:.2g})"
        if result.p_value is not None
        else "the final values could not be scored"
    )
    if result.fallback is not None:
        reason += f", nor the run's best validated values (p = {result.fallback['p_value']:.3g})"
    return result.model_copy(update={"returned": "start", "returned_score": result.start_score, "reason": reason})


def _mid_p(before: dict[str, float], after: dict[str, float], keys: list[str]) -> dict[str, Any]:
    """The sign test with its mid-p value (`opto.core.stats.sign_test_mid_p`)."""
    wins = sum(after[k] > before[k] for k in keys)
    discordant = wins + sum(after[k] < before[k] for k in keys)
    return {"test": "sign test, mid-p", "p_value": sign_test_mid_p(wins, discordant)}


def not_run(reason: str, final: dict[str, Any]) -> FinalCheckResult:
    """The result of a check the run could not make: the start is returned."""
    return FinalCheckResult(kind="not run", reason=reason, returned="start", search_parameters=dict(final))
