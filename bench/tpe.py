"""Benchmark: a float knob found by `TPEProposer` against the LLM optimizer.

The task. The agent has one float parameter, `temperature` in [0, 2]; on each example it
is right with probability 0.85 - 0.6 (t - 1.23)^2 (at least 0.05): one peak, at 1.23,
worth 0.85. Which examples a value gets right is fixed by a hash of the value (rounded
to 4 places) and the example, so scores are noisy: two close values differ in detail.

The LLM optimizer (a `ScriptedModel` reading opto's reflective prompt) sees the failures
and the current value, but failures say nothing about the direction, so like an LLM it
guesses: a step of 0.05 to 0.5 up or down. `TPEProposer` is told every candidate's
validation score. Both run greedy acceptance on a 40-example validation set (each
candidate validated on all of it) for 60 steps of 4 examples.

Reported over 20 seeds: the validation evaluations (candidates scored on the validation
set) until the values the run would end with are within 2% of the best attainable
(expected accuracy >= 0.98 x 0.85) and stay there, how many runs got there, and the
expected accuracy at the end.

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
from opto.search.validation import DatasetValidation

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
    trainer = AggregatedUpdate(agent, proposer, validation=DatasetValidation(data(40, 1000)))
    curve: list[tuple[int, float]] = []
    evaluations = [0]

    class Watch(Callback):
        def on_step_end(self, record: Any) -> None:
            evaluations[0] += sum(1 for d in record.decisions if d.stage is None)
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
        kept = [k for k in (kept_at(c, target) for c in curves) if k is not None]
        final = [c[-1][1] for c in curves]
        rows.append((label, kept, final))
    print(f"{args.seeds} seeds, {args.steps} steps; best attainable {BEST}, within 2%: >= {target:.3f}; Python "
          f"{platform.python_version()}, load {os.getloadavg()[0]:.2f}, {time.time() - started:.0f} s\n")
    print("| proposer | runs within 2% for good | validation evaluations until then: median of all runs "
          "| mean +- sd of the runs that got there | expected accuracy at the end |")
    print("|---|---:|---:|---:|---:|")
    for label, kept, final in rows:
        calls = f"{statistics.fmean(kept):.1f} +- {statistics.pstdev(kept):.1f}" if kept else "-"
        print(f"| {label} | {len(kept)}/{args.seeds} | {_median(kept, args.seeds, args.steps)} | {calls} | "
              f"{statistics.fmean(final):.3f} +- {statistics.pstdev(final):.3f} |")


def _median(kept: list[int], runs: int, steps: int) -> str:
    """The median over all runs, a run that never got there counting as more than any."""
    ordered: list[int | None] = [*sorted(kept), *[None] * (runs - len(kept))]
    middle = ordered[(runs - 1) // 2: runs // 2 + 1]
    if None in middle:
        return f"not within {steps} steps"
    return f"{statistics.fmean(m for m in middle if m is not None):.1f}"


if __name__ == "__main__":
    sys.exit(main())
