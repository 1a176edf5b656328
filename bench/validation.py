"""Benchmark: how often acceptance rules accept a candidate that is not better, and how
often they accept one that is.

Each step compares a candidate with the current values on n validation examples, the
way `DatasetValidation` does (its `compare`, the code every step's decision runs). Every
example has a difficulty d drawn uniformly from [0.2, 0.7]; the current values get it
right with probability d. Two models of how a candidate's answers relate to them:

- independent: the candidate's answer is a fresh draw (right with probability d under
  the null, d + margin under the alternative). Candidates disagree with the current
  values on about half the examples, the worst case for a paired test;
- related (closer to prompt edits, which change a few answers): the candidate breaks 5%
  of the answers the current values got right and fixes a share of the wrong ones, as
  many as it breaks under the null, `margin` more under the alternative.

No candidate is better under the null; under the alternative, every candidate is better
by `margin` in expected accuracy. Reported, for the default rule (any strict win) and
for `alpha=0.05` (the exact sign test), at 24, 64 and 200 validation examples: the
share of candidates accepted under each.

Then the small-data default (`validation="auto"` on fewer than 32 training examples:
candidates judged on the step's batch, `MinibatchValidation(alpha=0.1)`), against the
rule it replaced (the same test, Holm-corrected over the step's candidates, and no test
at all below a configured batch of 4):

- the smallest win each accepts, per batch size and number of candidates: the fewest
  examples a candidate must fix (none broken) when the step's other candidates change
  nothing;
- the share of steps that accept a candidate when none is better, per batch size and
  number of candidates (each candidate drawn as above, independently).

Last, the final check's own decision (a run's returned values against its start, the
mid-p sign test at 0.1): how often a candidate that is not better, or better by the
margin, is returned instead of the start, on 12, 24 and 64 check examples.

    python bench/validation.py                  # 1000 steps a cell, margin 0.15
    python bench/validation.py --steps 4000 --margin 0.10
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Iterator

import numpy as np

from opto import Rollout
from opto.search.validation import Decision, holm_corrected
from opto import DatasetValidation, MinibatchValidation


def rollouts(correct: np.ndarray) -> list[Rollout]:
    return [Rollout(example_id=f"e{i}", score=float(c)) for i, c in enumerate(correct)]


BREAKS = 0.05  # the related model: the share of right answers a candidate breaks


def candidate_answers(rng: np.random.Generator, difficulty: np.ndarray, current: np.ndarray, margin: float,
                      model: str) -> np.ndarray:
    if model == "independent":
        return rng.random(len(current)) < np.minimum(1.0, difficulty + margin)
    # Expected change: fixes * (1 - d) - BREAKS * d = margin, per example.
    fixes = np.clip((margin + BREAKS * difficulty) / (1 - difficulty), 0.0, 1.0)
    flip = np.where(current, rng.random(len(current)) < BREAKS, rng.random(len(current)) < fixes)
    return np.where(flip, ~current, current)


def drawn_steps(
    n: int, margin: float, steps: int, seed: int, model: str, candidates: int = 1
) -> Iterator[tuple[np.ndarray, list[np.ndarray]]]:
    """Each step's current answers on n examples and its candidates' answers."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        difficulty = rng.uniform(0.2, 0.7, n)
        current = rng.random(n) < difficulty
        yield current, [candidate_answers(rng, difficulty, current, margin, model) for _ in range(candidates)]


def acceptance_rate(rule: object, n: int, margin: float, steps: int, seed: int, model: str) -> float:
    accepted = sum(
        rule.compare("candidate", rollouts(current), rollouts(candidate), 0.0).accepted  # type: ignore[attr-defined]
        for current, [candidate] in drawn_steps(n, margin, steps, seed, model)
    )
    return accepted / steps


SMALL_ALPHA = 0.1


def step_accepts(rule: str, current: np.ndarray, candidates: list[np.ndarray]) -> bool:
    """Whether a step with these candidates keeps one, under the small-data default
    ("now") or the rule before it ("before": Holm over the step's candidates, and no test
    below a batch of 4)."""
    if rule == "now":
        validation = MinibatchValidation(alpha=SMALL_ALPHA)
    else:
        validation = MinibatchValidation(alpha=SMALL_ALPHA if len(current) >= 4 else None)
    decisions: list[Decision] = [
        validation.compare(f"c{i}", rollouts(current), rollouts(c), 0.0) for i, c in enumerate(candidates)
    ]
    decisions = validation.across_candidates(decisions) if rule == "now" else holm_corrected(decisions, validation.alpha)
    return any(d.accepted for d in decisions)


def smallest_win(rule: str, n: int, k: int) -> int | None:
    """The fewest examples fixed (current wrong everywhere, none broken) that `rule`
    accepts on a batch of n with k candidates, the others changing nothing."""
    current = np.zeros(n, dtype=bool)
    for fixed in range(1, n + 1):
        winner = np.arange(n) < fixed
        if step_accepts(rule, current, [winner] + [current.copy() for _ in range(k - 1)]):
            return fixed
    return None


def null_step_rate(rule: str, n: int, k: int, steps: int, seed: int, model: str) -> float:
    drawn = drawn_steps(n, 0.0, steps, seed, model, candidates=k)
    return sum(step_accepts(rule, current, candidates) for current, candidates in drawn) / steps


def small_data_tables(steps: int) -> None:
    print()
    print("Small-data default: the smallest win accepted (examples fixed, none broken, of the batch)")
    print()
    print("| batch | candidates | before | now |")
    print("|---:|---:|---:|---:|")
    for n in (2, 3, 4, 5, 6, 8, 16):
        for k in (1, 2, 3):
            before, now = smallest_win("before", n, k), smallest_win("now", n, k)
            show = lambda found: "never" if found is None else f"{found} of {n}"  # noqa: E731
            print(f"| {n} | {k} | {show(before)} | {show(now)} |")
    print()
    print(f"Small-data default: steps that keep a candidate when none is better ({steps} steps a cell)")
    print()
    print("| answers | batch | candidates | before | now |")
    print("|---|---:|---:|---:|---:|")
    for model in ("independent", "related"):
        for n in (4, 8, 16):
            for k in (1, 2, 3):
                before = null_step_rate("before", n, k, steps, seed=100 * n + k, model=model)
                now = null_step_rate("now", n, k, steps, seed=100 * n + k, model=model)
                print(f"| {model} | {n} | {k} | {before:.1%} | {now:.1%} |")


class _Scores:
    """Stands for the final check's measurements: fixed 0/1 answers per set of values."""

    def __init__(self, answers: dict[str, np.ndarray]) -> None:
        self.answers = answers

    async def scores(self, values: dict[str, str], rounds: int) -> dict[str, float]:
        return {f"e{i}": float(c) for i, c in enumerate(self.answers[values["v"]])}


def final_check_rate(n: int, margin: float, steps: int, seed: int, model: str) -> float:
    """How often the final check (`opto.trainer.final_check`, its own decision code: the
    mid-p sign test at alpha 0.1) returns a candidate rather than the start."""
    import asyncio

    from opto.trainer.final_check import _compare

    returned = 0
    for current, [candidate] in drawn_steps(n, margin, steps, seed, model):
        measured = _Scores({"start": current, "final": candidate})
        _, shown, _ = asyncio.run(_compare(measured, {"v": "start"}, {"v": "final"}, 0.1, 1))  # type: ignore[arg-type]
        returned += shown
    return returned / steps


def final_check_table(steps: int, margin: float) -> None:
    print()
    print(f"The final check: runs that return the candidate instead of the start ({steps} runs a cell)")
    print()
    print(f"| answers | check examples | not better | better by {margin:+.0%} |")
    print("|---|---:|---:|---:|")
    for model in ("independent", "related"):
        for n in (12, 24, 64):
            null = final_check_rate(n, 0.0, steps, seed=1000 + n, model=model)
            power = final_check_rate(n, margin, steps, seed=2000 + n, model=model)
            print(f"| {model} | {n} | {null:.1%} | {power:.1%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--margin", type=float, default=0.15)
    args = parser.parse_args()
    started = time.time()
    rules = {"default (any strict win)": MinibatchValidation(), "alpha=0.05 (exact sign test)":
             DatasetValidation([{"x": 0, "info": "0"}], alpha=0.05)}
    rows = []
    for model in ("independent", "related"):
        for n in (24, 64, 200):
            for name, rule in rules.items():
                null = acceptance_rate(rule, n, 0.0, args.steps, seed=n, model=model)
                power = acceptance_rate(rule, n, args.margin, args.steps, seed=n + 1, model=model)
                rows.append((model, n, name, null, power))
    print(f"{args.steps} steps a cell, true improvement {args.margin:+.2f}; Python {platform.python_version()}, "
          f"load {os.getloadavg()[0]:.2f}, {time.time() - started:.0f} s")
    print()
    print(f"| answers | validation examples | rule | accepted, no candidate better | "
          f"accepted, candidate {args.margin:+.0%} |")
    print("|---|---:|---|---:|---:|")
    for model, n, name, null, power in rows:
        print(f"| {model} | {n} | {name} | {null:.1%} | {power:.1%} |")
    small_data_tables(args.steps)
    final_check_table(args.steps, args.margin)


if __name__ == "__main__":
    main()
