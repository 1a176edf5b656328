"""Benchmark: a float knob found by `TPEProposer` against the LLM optimizer.

The task. The agent has one float parameter, `temperature` in [0, 2]; on each example it
is right with probability 0.85 - 0.6 (t - 1.23)^2 (at least 0.05): one peak, at 1.23,
worth 0.85. Which examples a value gets right is fixed by a hash of the value (rounded
to 4 places) and the example, so scores are noisy: two close values differ in detail.

The LLM optimizer (a `ScriptedModel` reading opto's reflective prompt) sees the failures
and the current value, but failures say nothing about the direction, so like an LLM it
guesses: a step of 0.05 to 0.5 up or down (random proposals). `TPEProposer` is told
every candidate's validation score, or its score where it was stopped early. Both run
for 60 steps of 4 examples with `validation=` a 40-example set, the default for a greedy
search: `MinibatchFirst(set, race=8, accept_ties=True)`, which screens each candidate on
the step's batch and races only those that win there on the set.

Reported over 20 seeds: the validation evaluations (candidates that reached the
validation set, a raced one counting as one) until the values the run would end with are
within 2% of the best attainable (expected accuracy >= 0.98 x 0.85) and stay there, how
many runs got there, and the expected accuracy at the end. As many runs of the random
proposals never get there, the ratio TPE / random is taken on the evaluations per run
that got there: every run's evaluations until it got there (or until its end) over the
runs that got there (the expected running time of the COCO benchmarks).

    pip install 'opto-agents[tpe]'
    python bench/tpe.py
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import re
import statistics
import sys
import time
from typing import Any

from opto import Agent, AggregatedUpdate, Callback, Constraint, ExactMatchGuide, Optimizer, Parameter, ScriptedModel
from opto.search import TPEProposer

PEAK, BEST = 1.23, 0.85


def accuracy(t: float) -> float:
    return max(0.05, BEST - 0.6 * (t - PEAK) ** 2)


def unit(*parts: Any) -> float:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "big") / 2**64


class Knob(Agent):
    def __init__(self, model: ScriptedModel) -> None:
        self.model = model
        self.temperature = Parameter(0.2, constraint=Constraint(min=0.0, max=2.0), description="sampling temperature")

    async def forward(self, x: str) -> str:
        reply = await self.model.complete([{"role": "system", "content": str(self.temperature.value)},
                                           {"role": "user", "content": x}])
        return reply.text


def agent_reply(messages: list[dict[str, Any]]) -> str:
    t, x = float(messages[0]["content"]), messages[-1]["content"]
    return f"right-{x}" if unit(round(t, 4), x) < accuracy(t) else "wrong"


def optimizer_reply(seed: int):
    def reply(messages: list[dict[str, Any]]) -> str:
        text = messages[-1]["content"]
        current = float(re.search(r"- current value: ([\d.]+)", text).group(1))
        rng = random.Random(f"{seed}|{current}|{text.count('went wrong')}")
        step = rng.uniform(0.05, 0.5) * rng.choice((-1, 1))
        return json.dumps({"reasoning": "try another temperature",
                           "suggestion": {"temperature": round(min(2.0, max(0.0, current + step)), 4)}})
    return reply


def data(n: int, offset: int) -> list[dict[str, Any]]:
    return [{"x": f"q{offset + i}", "info": f"right-q{offset + i}", "id": f"q{offset + i}"} for i in range(n)]


def run(kind: str, seed: int, steps: int) -> list[tuple[int, float]]:
    """(validation evaluations so far, expected accuracy of the values) after each step."""
    agent = Knob(ScriptedModel(agent_reply, name="agent"))
    proposer = TPEProposer(seed=seed) if kind == "tpe" else Optimizer(ScriptedModel(optimizer_reply(seed), name="llm"))
    trainer = AggregatedUpdate(agent, proposer, validation=data(40, 1000))
    curve: list[tuple[int, float]] = []
    evaluations = [0]

    class Watch(Callback):
        def on_step_end(self, record: Any) -> None:
            # A candidate screened out on the batch ("minibatch") never reached the set; a
            # decision without a candidate is a step that had none.
            evaluations[0] += sum(d.candidate_id is not None and d.stage != "minibatch" for d in record.decisions)
            curve.append((evaluations[0], accuracy(trainer.final_values()["temperature"])))

    trainer.train(ExactMatchGuide(), data(4 * steps, 0), batch_size=4, seed=seed, progress=False,
                  callbacks=[Watch()])
    return curve


def kept_at(curve: list[tuple[int, float]], target: float) -> int | None:
    below = [i for i, (_, score) in enumerate(curve) if score < target]
    if below and below[-1] + 1 >= len(curve):
        return None
    return curve[below[-1] + 1][0] if below else curve[0][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    started = time.time()
    target = 0.98 * BEST
    rows = []
    for kind, label in (("llm", "LLM optimizer (reflective)"), ("tpe", "TPEProposer")):
        curves = [run(kind, seed, args.steps) for seed in range(args.seeds)]
        reached = [kept_at(c, target) for c in curves]
        kept = [k for k in reached if k is not None]
        spent = sum(c[-1][0] if k is None else k for c, k in zip(curves, reached))
        final = [c[-1][1] for c in curves]
        rows.append((label, kept, spent / len(kept) if kept else None, final))
    print(f"{args.seeds} seeds, {args.steps} steps; best attainable {BEST}, within 2%: >= {target:.3f}; Python "
          f"{platform.python_version()}, load {os.getloadavg()[0]:.2f}, {time.time() - started:.0f} s\n")
    print("| proposer | runs within 2% for good | validation evaluations until then: median of all runs "
          "| mean +- sd of the runs that got there | per run that got there | expected accuracy at the end |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, kept, per_run, final in rows:
        calls = f"{statistics.fmean(kept):.1f} +- {statistics.pstdev(kept):.1f}" if kept else "-"
        print(f"| {label} | {len(kept)}/{args.seeds} | {_median(kept, args.seeds, args.steps)} | {calls} | "
              f"{'-' if per_run is None else f'{per_run:.1f}'} | "
              f"{statistics.fmean(final):.3f} +- {statistics.pstdev(final):.3f} |")
    (_, random_kept, random_per_run, _), (_, tpe_kept, tpe_per_run, _) = rows
    if random_per_run is None or tpe_per_run is None:
        print("\nTPE / random proposals: no ratio, as one of them never got within 2% for good")
        return
    ratio = tpe_per_run / random_per_run
    print(f"\nTPE / random proposals, validation evaluations per run that got within 2% for good: {ratio:.2f}x "
          f"(target <= 0.5x: {'met' if ratio <= 0.5 else 'missed'}); on the mean of the runs that got there: "
          f"{statistics.fmean(tpe_kept) / statistics.fmean(random_kept):.2f}x")


def _median(kept: list[int], runs: int, steps: int) -> str:
    """The median over all runs, a run that never got there counting as more than any."""
    ordered: list[int | None] = [*sorted(kept), *[None] * (runs - len(kept))]
    middle = ordered[(runs - 1) // 2: runs // 2 + 1]
    if None in middle:
        return f"not within {steps} steps"
    return f"{statistics.fmean(m for m in middle if m is not None):.1f}"


if __name__ == "__main__":
    sys.exit(main())
