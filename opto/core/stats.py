"""Statistics for decisions and scores: paired tests, intervals, multiple comparisons.

- `paired_test(current, candidate)`: is the candidate better on the same examples? For
  0/1 scores, the exact one-sided sign test on the discordant pairs (McNemar's exact
  test): only examples where the two differ carry information, and under "not better"
  each is a fair coin. For graded scores, a one-sided paired bootstrap of the mean
  difference (seeded), which assumes nothing about the scores' distribution (Wilcoxon
  would assume a symmetric difference). Both come with a 95% interval of the mean
  difference, a seeded paired bootstrap (one method for every interval of a difference).
- `score_interval(scores)`: a 95% interval of a mean score: Wilson's for 0/1 scores
  (good coverage even near 0% and 100%, where the normal interval fails), a seeded
  percentile bootstrap over examples otherwise.
- `holm(p_values, alpha)`: which of several tests still reject after Holm's
  step-down correction (several candidates compared in one step).
- `smallest_shown_gain(examples, level)` and `examples_needed(gain, changed)`: a
  check's power, said before and after a run (the final check and the statistics page).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel

from ..errors import OptoValueError

__all__ = [
    "Interval",
    "PairedTest",
    "examples_needed",
    "holm",
    "is_binary",
    "paired_change",
    "paired_test",
    "score_interval",
    "sign_test_power",
    "smallest_shown_gain",
]

_Z95 = 1.959963984540054
_BOOTSTRAP = 2000


class Interval(BaseModel):
    """A 95% confidence interval and how it was made."""

    low: float
    high: float
    method: str

    def percent(self) -> str:
        return f"[{100 * self.low:.1f}, {100 * self.high:.1f}]"


class PairedTest(BaseModel):
    """The one-sided paired test of "the candidate is not better than the current values"."""

    test: str
    statistic: float
    p_value: float
    difference: float
    interval: Interval
    n: int


def is_binary(scores: Sequence[float]) -> bool:
    return all(s in (0.0, 1.0) for s in scores)


def score_interval(scores: Sequence[float | None], seed: int = 0) -> Interval | None:
    """A 95% interval of the mean of the scores that exist (None when there are none)."""
    found = [float(s) for s in scores if s is not None]
    if not found:
        return None
    n = len(found)
    if is_binary(found):
        p = sum(found) / n
        centre = (p + _Z95**2 / (2 * n)) / (1 + _Z95**2 / n)
        half = _Z95 * math.sqrt(p * (1 - p) / n + _Z95**2 / (4 * n * n)) / (1 + _Z95**2 / n)
        # Rounding must not leave the observed mean outside (at 0% the low end is exactly 0).
        return Interval(low=max(0.0, min(p, centre - half)), high=min(1.0, max(p, centre + half)), method="wilson")
    means = _bootstrap_means(np.asarray(found), seed)
    return Interval(low=float(np.percentile(means, 2.5)), high=float(np.percentile(means, 97.5)), method="bootstrap")


def paired_change(before: Sequence[float | None], after: Sequence[float | None]) -> PairedTest | None:
    """`paired_test` over the examples judged both times (None marks an unjudged score), or
    None when there is no such example: the change with its paired 95% interval."""
    if len(before) != len(after):
        raise OptoValueError(f"paired_change needs scores of the same examples, got {len(before)} and {len(after)}")
    pairs = [(a, b) for a, b in zip(before, after) if a is not None and b is not None]
    return paired_test([a for a, _ in pairs], [b for _, b in pairs]) if pairs else None


def paired_test(current: Sequence[float], candidate: Sequence[float], seed: int = 0) -> PairedTest:
    """One-sided test of "candidate <= current" on paired per-example scores."""
    if len(current) != len(candidate) or not current:
        raise OptoValueError(
            f"a paired test needs scores of the same examples, got {len(current)} and {len(candidate)}"
        )
    a, b = np.asarray(current, dtype=float), np.asarray(candidate, dtype=float)
    difference = b - a
    means = _bootstrap_means(difference, seed)
    interval = Interval(
        low=float(np.percentile(means, 2.5)), high=float(np.percentile(means, 97.5)), method="paired bootstrap"
    )
    if is_binary(list(a)) and is_binary(list(b)):
        wins, losses = int(np.sum(difference > 0)), int(np.sum(difference < 0))
        p = _sign_test_p(wins, wins + losses)
        return PairedTest(
            test="exact sign test (McNemar)",
            statistic=float(wins),
            p_value=p,
            difference=float(difference.mean()),
            interval=interval,
            n=len(a),
        )
    # Bootstrap under the null: the differences re-centred on zero.
    centred = _bootstrap_means(difference - difference.mean(), seed + 1)
    p = float((np.sum(centred >= difference.mean()) + 1) / (len(centred) + 1))
    return PairedTest(
        test="paired bootstrap",
        statistic=float(difference.mean()),
        p_value=p,
        difference=float(difference.mean()),
        interval=interval,
        n=len(a),
    )


def holm(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Which hypotheses Holm's step-down procedure rejects at family-wise level `alpha`."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    for rank, index in enumerate(order):
        if p_values[index] > alpha / (len(p_values) - rank):
            break
        rejected[index] = True
    return rejected


def _sign_test_p(wins: int, discordant: int) -> float:
    """P(at least `wins` heads in `discordant` fair coin flips); 1.0 with nothing discordant."""
    if discordant == 0:
        return 1.0
    return float(sum(math.comb(discordant, k) for k in range(wins, discordant + 1)) / 2**discordant)


def sign_test_mid_p(wins: int, discordant: int) -> float:
    """The sign test's mid-p value: `_sign_test_p` less half the probability of exactly
    `wins`. The exact p is conservative on few discordant pairs (3 won of 3: 0.125); the
    mid-p (0.0625) keeps the level close to nominal (Fagerland et al., 2013)."""
    if discordant == 0:
        return 1.0
    return _sign_test_p(wins, discordant) - 0.5 * math.comb(discordant, wins) / 2**discordant


def smallest_shown_gain(examples: int, level: float) -> float | None:
    """The smallest mean gain (a share of the examples) that a one-sided sign test (mid-p)
    on `examples` paired examples can show at `level`: every example that changed won and
    none lost. Any loss raises it. None when a win on every example cannot pass."""
    wins = next((k for k in range(1, examples + 1) if sign_test_mid_p(k, k) <= level), None)
    return None if wins is None else wins / examples


def examples_needed(gain: float, changed: float, level: float = 0.1, power: float = 0.8) -> int:
    """Paired examples a one-sided sign test (mid-p, as the final check) needs to show a
    true mean gain `gain` (a share: 0.05 is 5 points) with probability `power` at `level`,
    when a share `changed` of the examples change outcome between the two values (wins
    and losses: `changed >= gain`; a good start that gains a little while losing some
    has `changed` well above `gain`). Exact binomial power (`sign_test_power`); n is
    found by growing and bisecting."""
    if not 0 < gain <= changed <= 1:
        raise OptoValueError(f"examples_needed needs 0 < gain <= changed <= 1, got gain={gain}, changed={changed}")
    low, high = 0, 1
    while sign_test_power(high, gain, changed, level) < power:  # grow, then bisect (the power wiggles a little)
        low, high = high, max(high + 1, int(high * 1.25))
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if sign_test_power(middle, gain, changed, level) >= power else (middle, high)
    return high


def sign_test_power(n: int, gain: float, changed: float, level: float) -> float:
    """The chance that the one-sided mid-p sign test on `n` paired examples passes at
    `level` when each example is won with probability (changed + gain) / 2 and lost with
    (changed - gain) / 2 (exact: the binomial count of changed examples, then of wins)."""
    if n <= 0:
        return 0.0
    win_share = (changed + gain) / (2 * changed)
    d = np.arange(n + 1)
    log_comb = np.array([math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) for k in d])
    with np.errstate(divide="ignore"):
        log_changed = (
            d * np.log(changed) + (n - d) * np.log1p(-changed) if changed < 1 else np.where(d == n, 0.0, -np.inf)
        )
    weights = np.exp(log_comb + log_changed)
    total = 0.0
    for discordant in range(1, n + 1):
        if weights[discordant] < 1e-12:
            continue
        wins = np.arange(discordant + 1)
        under_null = np.array([math.comb(discordant, w) for w in wins], dtype=float) / 2.0**discordant
        above = np.concatenate([np.cumsum(under_null[::-1])[::-1][1:], [0.0]])  # P(W > w) under the null
        passing = wins[above + 0.5 * under_null <= level]
        if not len(passing):
            continue
        first = int(passing[0])
        tail = sum(math.comb(discordant, w) * win_share**w * (1 - win_share) ** (discordant - w)
                   for w in range(first, discordant + 1))  # fmt: skip
        total += weights[discordant] * tail
    return float(total)


def _bootstrap_means(values: np.ndarray, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(values), size=(_BOOTSTRAP, len(values)))
    return values[picks].mean(axis=1)
