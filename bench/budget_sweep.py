"""Benchmark: GEPA's quick start on a small metric-call budget, `gepa.optimize` beside opto's
bridge `opto.integrations.gepa.optimize` (the same call, the same keywords), at
`max_metric_calls` 10, 20, 30 and 50.

The call is the shape of GEPA's README quick start: a prompt to improve, a small train set
and valset, GEPA's `DefaultAdapter` on a task model, a reflection model, a budget:

    gepa.optimize(seed_candidate={"system_prompt": SEED}, trainset=train, valset=val,
                  adapter=DefaultAdapter(model=task_lm), reflection_lm=reflection_lm,
                  max_metric_calls=N, seed=seed)

Both models are scripted (no network, no API). The task: name a country's capital. The task
model answers it only when its system prompt asks for "the capital city" (the fix); else it
says "<country> is a country." (wrong: GEPA's evaluator wants the capital in the reply).
The seed prompt does not ask for it, so it scores 0 everywhere. The reflection model,
shown failures, proposes the fix with probability `--p-fix` (0.5) and otherwise a
harmless rephrasing that fixes nothing; its draws are fixed by the run's seed and how
many times it was called, so a run is deterministic given its seed. It reads GEPA's
reflection prompt (replies in a ``` block) or opto's (replies in opto's JSON).

With 6 training examples and 3 in the valset, GEPA can find the fix in 12 metric calls:
the seed on the valset (3), one minibatch of 3 under the seed and 3 under the proposal,
the proposal on the valset (3). `max_metric_calls` stops GEPA between iterations, so an
iteration that starts below the budget finishes (GEPA may pass it).

Reported per budget and side, over the seeds: the runs whose returned prompt holds the fix
(and its mean accuracy on 10 held-out countries, which cost no metric call), the metric
calls made (the adapter's evaluations, as each side counts them), the runs that returned
the seed prompt, and for opto what it said when it returned the seed (its final check's
reason, or why the run stopped before checking), with how many runs said it.

    pip install gepa==0.1.4
    python bench/budget_sweep.py                        # budgets 10 20 30 50, 20 seeds
    python bench/budget_sweep.py --budgets 10 20 --seeds 3 --p-fix 0.3
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import os
import platform
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

try:
    import gepa
    from gepa.adapters.default_adapter.default_adapter import DefaultAdapter
except ImportError as exc:  # GEPA is the benchmark's peer, never a dependency of opto
    raise SystemExit("bench/budget_sweep.py needs GEPA: pip install gepa==0.1.4") from exc

from opto.integrations.gepa import optimize as opto_optimize

CAPITALS = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Peru": "Lima", "Japan": "Tokyo",
            "Kenya": "Nairobi", "Egypt": "Cairo", "Chile": "Santiago", "Ghana": "Accra", "Nepal": "Kathmandu",
            "Cuba": "Havana", "Fiji": "Suva", "Laos": "Vientiane", "Mali": "Bamako", "Oman": "Muscat",
            "Togo": "Lome", "Iran": "Tehran", "Iraq": "Baghdad", "Chad": "Ndjamena"}  # fmt: skip
NAMES = list(CAPITALS)
TRAIN, VAL, TEST = NAMES[:6], NAMES[6:9], NAMES[9:19]
SEED_PROMPT = "You are a helpful assistant. Answer the question."
FIX = "Answer with the capital city of the country, in one word."
# What the reflection writes when it does not find the fix: other words, the same behaviour.
REPHRASINGS = ["You are a helpful assistant. Reply to the question.",
               "You are a friendly assistant. Answer the question briefly.",
               "Answer the user's question helpfully.",
               "You are an assistant. Answer what is asked."]  # fmt: skip


def rows(names: list[str]) -> list[dict[str, Any]]:
    """GEPA's `DefaultAdapter` data instances."""
    return [{"input": f"What is the capital of {n}?", "answer": CAPITALS[n], "additional_context": {}} for n in names]


def task_lm(messages: list[dict[str, str]]) -> str:
    """The task model: right only when the system prompt asks for the capital city."""
    system, question = messages[0]["content"], messages[-1]["content"]
    country = question.rsplit(" ", 1)[-1].rstrip("?")
    return CAPITALS.get(country, "?") if "capital city" in system else f"{country} is a country."


def scripted_reflection(seed: int, p_fix: float) -> Callable[[str], str]:
    """The reflection model: the fix with probability `p_fix` per call (the n-th call's draw
    fixed by the seed), else a rephrasing; in GEPA's reply format or opto's."""
    calls = [0]

    def reflection_lm(prompt: str) -> str:
        calls[0] += 1
        rng = random.Random(f"{seed}|reflection|{calls[0]}")
        text = FIX if rng.random() < p_fix else rng.choice(REPHRASINGS)
        if "improve the parameters" in prompt:  # opto's reflective prompt: a JSON reply
            return json.dumps({"reasoning": "what the failures suggest", "suggestion": {"system_prompt": text}})
        return f"```\n{text}\n```"  # GEPA's: the new text in a ``` block

    return reflection_lm


class _Quiet:
    """GEPA's logger, silenced (the table says what matters)."""

    def log(self, message: str) -> None:
        pass


@dataclass
class Run:
    found_fix: bool
    held_out: float  # the returned prompt's accuracy on the held-out countries
    metric_calls: int
    returned_seed: bool
    said: str = ""  # opto: why it returned the seed (empty otherwise)


def held_out(prompt: dict[str, str]) -> float:
    scores = DefaultAdapter(model=task_lm).evaluate(rows(TEST), prompt).scores
    return sum(scores) / len(scores)


def run(side: str, budget: int, seed: int, p_fix: float) -> Run:
    """One quick-start call on `side` ("gepa" or "opto"): the same arguments for both."""
    call = dict(seed_candidate={"system_prompt": SEED_PROMPT}, trainset=rows(TRAIN), valset=rows(VAL),
                adapter=DefaultAdapter(model=task_lm), reflection_lm=scripted_reflection(seed, p_fix),
                max_metric_calls=budget, seed=seed, display_progress_bar=False)  # fmt: skip
    if side == "gepa":
        found = gepa.optimize(**call, logger=_Quiet())
        said = ""
    else:
        found = opto_optimize(**call)
        said = _why_seed(found.result) if found.best_candidate == call["seed_candidate"] else ""
    best = dict(found.best_candidate)
    return Run(found_fix="capital city" in best["system_prompt"], held_out=held_out(best),
               metric_calls=found.total_metric_calls, returned_seed=best == call["seed_candidate"], said=said)


def _why_seed(result: Any) -> str:
    """What opto said when it returned the seed: why the run stopped (when a stop condition
    ended it), the steps it finished, and its final check's reason."""
    said = [f"stopped: {result.stopped_reason}"] if result.stopped_reason else []
    said.append(f"{result.steps} steps finished, {result.accepted} accepted")
    if result.final_check is not None and result.final_check.reason:
        said.append(f"final check: {result.final_check.reason}")
    return "; ".join(said)


@dataclass
class Row:
    runs: list[Run] = field(default_factory=list)

    def line(self, side: str, budget: int) -> str:
        fixed = [r for r in self.runs if r.found_fix]
        calls = [r.metric_calls for r in self.runs]
        return (f"| {budget} | {side} | {len(fixed)}/{len(self.runs)} | "
                f"{statistics.fmean(r.held_out for r in self.runs):.2f} | "
                f"{statistics.fmean(calls):.1f} ({min(calls)}-{max(calls)}) | "
                f"{sum(r.returned_seed for r in self.runs)}/{len(self.runs)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budgets", type=int, nargs="*", default=[10, 20, 30, 50])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--p-fix", type=float, default=0.5, help="the reflection's chance of proposing the fix")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # opto's notices (the check's verdict is in the table)
    started = time.time()
    results = {(b, side): Row([run(side, b, seed, args.p_fix) for seed in range(args.seeds)])
               for b in args.budgets for side in ("gepa", "opto")}
    print(f"{args.seeds} seeds a budget, p(fix) {args.p_fix}, train {len(TRAIN)}, valset {len(VAL)}, held out "
          f"{len(TEST)}; gepa {importlib.metadata.version('gepa')}, Python {platform.python_version()}, load "
          f"{os.getloadavg()[0]:.2f}, {time.time() - started:.0f} s\n")
    print("| max_metric_calls | side | runs that found the fix | held-out accuracy (mean) | "
          "metric calls made (mean, range) | runs returning the seed |")
    print("|---:|---|---:|---:|---:|---:|")
    for (budget, side), row in results.items():
        print(row.line("GEPA 0.1.4" if side == "gepa" else "opto bridge", budget))
    print("\nWhat opto said when it returned the seed (runs):\n")
    for budget in args.budgets:
        said = Counter(r.said for r in results[(budget, "opto")].runs if r.returned_seed)
        for text, n in said.most_common():
            print(f"- max_metric_calls={budget}, {n} run{'s' if n > 1 else ''}: {text}")


if __name__ == "__main__":
    sys.exit(main())
