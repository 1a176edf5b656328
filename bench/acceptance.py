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

    python bench/acceptance.py                  # 1000 steps a cell, margin 0.15
    python bench/acceptance.py --steps 4000 --margin 0.10
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

from opto import Rollout
from opto.trainer import DatasetValidation, MinibatchValidation


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


def acceptance_rate(rule: object, n: int, margin: float, steps: int, seed: int, model: str) -> float:
    rng = np.random.default_rng(seed)
    accepted = 0
    for _ in range(steps):
        difficulty = rng.uniform(0.2, 0.7, n)
        current = rng.random(n) < difficulty
        candidate = candidate_answers(rng, difficulty, current, margin, model)
        accepted += rule.compare("candidate", rollouts(current), rollouts(candidate), 0.0).accepted  # type: ignore[attr-defined]
    return accepted / steps


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


if __name__ == "__main__":
    main()
