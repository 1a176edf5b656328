"""Benchmark: search strategies on a simulated task where search matters.

The task. Examples belong to K = 6 classes ("c3 item 7"); the agent has two text
parameters, `rules_a` for classes 0-2 and `rules_b` for classes 3-5, each a list of rules,
one per class at most ("c1=good.k2x; c0=fair.9qa"), of which the agent reads only the
first 2 (a length limit: a rule pushed past the second is cut off, so rules compete for
room; two parameters give lineages something to merge). On an example of class c the agent is right with the probability its
rule for c gives: good 0.95, fair 0.6, bad 0.1, no rule 0.3. Which items a rule gets right
is fixed by a hash of the rule's text and the item (a temperature-0 model: the same prompt
gives the same answers), so two "good" rules differ in detail, as real prompts do.

The optimizer (a `ScriptedModel` function that reads opto's real optimizer prompt) sees
one failed example of class c and writes a rule for c at the front of its parameter: good
with probability 0.5, else fair; with probability 0.25 it also rewrites another rule as
bad (a fix that breaks something else). On a success it proposes nothing. The aggregator
(reading opto's real aggregator prompt) merges like a careless LLM: it applies every
suggestion's changes in order, the later winning, each changed rule moved to the front.
Merging lineages (`merge_every`) takes each parameter from the lineage that changed it.

The attainable expected validation score is (4 x 0.95 + 2 x 0.3) / 6 = 0.733: four good
rules in the room there is. Reported per strategy, mean and spread over 5 seeds: the
model calls (agent, optimizer, aggregator, validation) until the values the run would end
with reach 90% of it (scored by their expected accuracy on the validation set, which costs
no calls), first and for good (never below it again within the budget), how many runs got
there, the score at the budget, and the validation rollouts run and saved.

    python bench/search.py                     # 5 seeds, budget 3000 calls
    python bench/search.py --seeds 3 --budget 1500 --only greedy-merged greedy-each-first
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
from collections.abc import Callable
from typing import Any

from opto import (
    Agent,
    AggregatedUpdate,
    Callback,
    ExactMatchGuide,
    MaxCalls,
    MinibatchFirst,
    Optimizer,
    Parameter,
    ScriptedModel,
)

K, ROOM = 6, 2  # classes; rules read of each part
PARTS = {"rules_a": (0, 1, 2), "rules_b": (3, 4, 5)}  # the two parameters and the classes each covers
ACCURACY = {"good": 0.95, "fair": 0.6, "bad": 0.1, None: 0.3}
ATTAINABLE = (len(PARTS) * ROOM * ACCURACY["good"] + (K - len(PARTS) * ROOM) * ACCURACY[None]) / K
RULE = re.compile(r"c(\d+)=(good|fair|bad)\.(\w+)")
ITEM = re.compile(r"c(\d+) item (\d+)")


def rules_of(prompt: str) -> list[tuple[int, str, str]]:
    return [(int(c), quality, tag) for c, quality, tag in RULE.findall(prompt)]


def prompt_of(rules: list[tuple[int, str, str]]) -> str:
    return "; ".join(f"c{c}={quality}.{tag}" for c, quality, tag in rules)


def part_of(c: int) -> str:
    return next(name for name, classes in PARTS.items() if c in classes)


def read_rules(values: dict[str, str]) -> dict[int, tuple[str, str]]:
    """The rules the agent reads: the first ROOM of each part, the first rule of a class winning."""
    seen: dict[int, tuple[str, str]] = {}
    for name, text in values.items():
        for c, quality, tag in rules_of(text)[:ROOM]:
            if part_of(c) == name:
                seen.setdefault(c, (quality, tag))
    return seen


def unit(*parts: Any) -> float:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def expected_score(values: dict[str, str], examples: list[dict[str, Any]]) -> float:
    rules = read_rules(values)
    return statistics.fmean(ACCURACY[rules.get(e["class"], (None,))[0]] for e in examples)


def agent_reply(messages: list[dict[str, Any]]) -> str:
    rules = read_rules(json.loads(messages[0]["content"]))
    c, item = map(int, ITEM.search(messages[-1]["content"]).groups())
    quality, tag = rules.get(c, (None, ""))
    return f"answer-c{c}-{item}" if unit(quality, tag, c, item) < ACCURACY[quality] else "wrong"


class RuleAgent(Agent):
    def __init__(self, model: ScriptedModel) -> None:
        self.model = model
        self.rules_a = Parameter("", description=f"rules for classes {PARTS['rules_a']}, most important first")
        self.rules_b = Parameter("", description=f"rules for classes {PARTS['rules_b']}, most important first")

    async def forward(self, x: str) -> str:
        system = json.dumps({"rules_a": self.rules_a.value, "rules_b": self.rules_b.value})
        reply = await self.model.complete([{"role": "system", "content": system}, {"role": "user", "content": x}])
        return reply.text


def current_value(text: str, name: str) -> str:
    return json.loads(re.search(rf"## {name}\n(?:- .*\n)*?- current value: (\".*\")", text).group(1))


def optimizer_reply(seed: int) -> Callable[[list[dict[str, Any]]], str]:
    def reply(messages: list[dict[str, Any]]) -> str:
        text = messages[-1]["content"]
        if re.search(r"score: 1(\.0)?\b", text):
            return json.dumps({"reasoning": "it was right", "suggestion": {}})
        c, item = map(int, ITEM.search(text.split("# Input", 1)[1]).groups())
        name = part_of(c)
        current = current_value(text, name)
        rng = random.Random(f"{seed}|{current}|{c}|{item}")
        rules = [r for r in rules_of(current) if r[0] != c]
        quality = "good" if rng.random() < 0.5 else "fair"
        if rules and rng.random() < 0.25:
            victim = rng.randrange(len(rules))
            rules[victim] = (rules[victim][0], "bad", f"{rng.randrange(10**6):x}")
        rules.insert(0, (c, quality, f"{rng.randrange(10**6):x}"))
        return json.dumps({"reasoning": f"a rule for c{c}", "suggestion": {name: prompt_of(rules)}})

    return reply


def aggregator_reply(messages: list[dict[str, Any]]) -> str:
    blocks = re.split(r"# Suggestion \d+", messages[-1]["content"])[1:]
    suggestion = {}
    for name in PARTS:
        values = [json.loads(found.group(1)) for block in blocks
                  if (found := re.search(rf'"{name}": (".*")', block))]
        merged = rules_of(values[0]) if values else []
        for value in values[1:]:
            current = {c: (quality, tag) for c, quality, tag in merged}
            for c, quality, tag in reversed(rules_of(value)):
                if current.get(c) != (quality, tag):
                    merged = [(c, quality, tag), *[r for r in merged if r[0] != c]]
        suggestion[name] = prompt_of(merged)
    return json.dumps({"reasoning": "all changes", "suggestion": suggestion})


def dataset(per_class: int, offset: int) -> list[dict[str, Any]]:
    return [{"x": f"c{c} item {offset + i}", "info": f"answer-c{c}-{offset + i}", "id": f"c{c}-{offset + i}",
             "class": c} for c in range(K) for i in range(per_class)]


STRATEGIES: dict[str, dict[str, Any]] = {
    "greedy-merged": {},  # today's default: the aggregator's merge, validated on the batch
    "greedy-each": {"candidates": "each"},
    "greedy-both": {"candidates": "both"},
    "greedy-merged-valset": {"validation": "set"},
    "greedy-merged-first": {"validation": "first"},
    "greedy-each-valset": {"candidates": "each", "validation": "set"},
    "greedy-each-first": {"candidates": "each", "validation": "first"},
    "pareto-merged": {"selection": "pareto", "validation": "set"},
    "pareto-each": {"selection": "pareto", "candidates": "each", "validation": "set"},
    "pareto-each-first": {"selection": "pareto", "candidates": "each", "validation": "first"},
    "pareto-merged-merge": {"selection": "pareto", "validation": "set", "merge_every": 3},
    "pareto-each-first-merge": {"selection": "pareto", "candidates": "each", "validation": "first", "merge_every": 3},
}


class Counted:
    """A reply function that counts its calls."""

    def __init__(self, fn: Callable[[list[dict[str, Any]]], str]) -> None:
        self.fn, self.calls = fn, 0

    def __call__(self, messages: list[dict[str, Any]]) -> str:
        self.calls += 1
        return self.fn(messages)


def run(strategy: str, seed: int, budget: int, batch_size: int) -> dict[str, Any]:
    settings = dict(STRATEGIES[strategy])
    validation = dataset(4, 100)
    train = [{k: v for k, v in e.items() if k != "class"} for e in dataset(8, 0)]
    rows = [{k: v for k, v in e.items() if k != "class"} for e in validation]
    kind = settings.pop("validation", "minibatch")
    settings["validation"] = {"minibatch": "minibatch", "set": rows, "first": MinibatchFirst(rows)}[kind]
    agent_calls, brain_calls, aggregator_calls = Counted(agent_reply), Counted(optimizer_reply(seed)), Counted(
        aggregator_reply)
    agent = RuleAgent(ScriptedModel(agent_calls, name="agent"))
    trainer = AggregatedUpdate(agent, Optimizer(ScriptedModel(brain_calls, name="optimizer")),
                               llm=ScriptedModel(aggregator_calls, name="aggregator"), **settings)
    curve: list[tuple[int, float]] = []
    validations = {"done": 0, "saved": 0}

    class Watch(Callback):
        def on_step_end(self, record: Any) -> None:
            validations["done"] += sum(1 for e in record.events if e.type == "rollout" and e.phase == "validation")
            validations["saved"] += sum(d.rollouts_saved for d in record.decisions)
            values = trainer.pool.best().values if trainer.selection == "pareto" and trainer.pool else \
                agent.stored_values()
            calls = agent_calls.calls + brain_calls.calls + aggregator_calls.calls
            curve.append((calls, expected_score(values, validation)))

    trainer.train(ExactMatchGuide(), train, batch_size=batch_size, num_epochs=50, seed=seed, progress=False,
                  stop=MaxCalls(budget), callbacks=[Watch()])
    target = 0.9 * ATTAINABLE
    within = [(calls, score) for calls, score in curve if calls <= budget]
    reached = next((calls for calls, score in within if score >= target), None)
    # Reached and kept: the calls after which the values never fell below the mark again.
    below = [i for i, (_, score) in enumerate(within) if score < target]
    kept = within[below[-1] + 1][0] if below and below[-1] + 1 < len(within) else (
        within[0][0] if within and not below else None)
    at_budget = [score for _, score in within]
    return {"reached": reached, "kept": kept, "score": at_budget[-1] if at_budget else 0.0, **validations}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    names = args.only or list(STRATEGIES)
    started = time.time()
    results = {name: [run(name, seed, args.budget, args.batch_size) for seed in range(args.seeds)] for name in names}
    print(f"{args.seeds} seeds, budget {args.budget} calls, batch {args.batch_size}; attainable {ATTAINABLE:.3f}, "
          f"90% of it {0.9 * ATTAINABLE:.3f}; Python {platform.python_version()}, load {os.getloadavg()[0]:.2f}, "
          f"{time.time() - started:.0f} s")
    print()
    print("| strategy | calls to 90%, first reached | calls to 90%, reached and kept | score at budget "
          "| validation rollouts run | saved by minibatch-first |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, runs in results.items():
        calls, kept = (_calls([r[key] for r in runs]) for key in ("reached", "kept"))
        scores = [r["score"] for r in runs]
        done = statistics.fmean(r["done"] for r in runs)
        saved = statistics.fmean(r["saved"] for r in runs)
        share = f"{saved:.0f} ({saved / (saved + done):.0%})" if saved else "-"
        print(f"| {name} | {calls} | {kept} | {statistics.fmean(scores):.3f} +- {statistics.pstdev(scores):.3f} "
              f"| {done:.0f} | {share} |")


def _calls(found: list[int | None]) -> str:
    """Mean +- sd of the runs that got there, and how many did."""
    got = [c for c in found if c is not None]
    if not got:
        return f"- (0/{len(found)})"
    return f"{statistics.fmean(got):.0f} +- {statistics.pstdev(got):.0f} ({len(got)}/{len(found)})"


if __name__ == "__main__":
    sys.exit(main())
