"""Quality benchmark: which search strategy finds real improvements, at what cost.

Tasks x strategies x seeds, on the embedded SmolLM2-135M by default (or any OpenAI-
compatible endpoint with --base-url/--model). The agent is `opto.recipes.demo.FewShotAgent`
(a system prompt and a `Demos` list). Strategies:

- optimizer: the LLM `Optimizer` alone (prompt rewrites), greedy acceptance;
- demos: `DemoProposer` alone (demos from the training split), greedy;
- both: the two proposers together, greedy;
- demos+pareto / both+pareto: the same with the Pareto candidate pool;
- both+each+first: each proposal a candidate, screened on its batch before the
  validation split (`MinibatchFirst`);
- both+pareto+each+first+merge: the same with the Pareto pool and `merge_every=2`.

Acceptance uses the task's validation split, balanced by label where the task has few
labels (so a constant answer cannot win it); demos come from the train split; the test
split is only measured. Every row shows test accuracy before and after beside the best
constant answer on the same test examples, accepted steps, model calls spent on
optimization (test evaluations excluded), tokens and wall time; the summary gives mean
and spread over seeds.

    python bench/quality.py                                   # plural and sports, 3 seeds
    python bench/quality.py --tasks sports_understanding --strategies demos+pareto --seeds 0
    python bench/quality.py --base-url http://127.0.0.1:8000/v1 --model my-model
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

from opto import AggregatedUpdate, Aggregator, DemoProposer, ExactMatchGuide, MinibatchFirst, Optimizer, evaluate
from opto.core.data import Example
from opto.datasets import bigbench
from opto.recipes.demo import FewShotAgent, majority_baseline
from opto.llm import LocalModel, Model, OpenAIModel

# name: (proposers, selection, more AggregatedUpdate settings; "first" stands for
# validation=MinibatchFirst(the validation split))
STRATEGIES: dict[str, tuple[tuple[str, ...], str, dict[str, Any]]] = {
    "optimizer": (("optimizer",), "greedy", {}),
    "demos": (("demos",), "greedy", {}),
    "both": (("optimizer", "demos"), "greedy", {}),
    "demos+pareto": (("demos",), "pareto", {}),
    "both+pareto": (("optimizer", "demos"), "pareto", {}),
    "both+each+first": (("optimizer", "demos"), "greedy", {"candidates": "each", "validation": "first"}),
    "both+pareto+each+first+merge": (("optimizer", "demos"), "pareto",
                                     {"candidates": "each", "validation": "first", "merge_every": 2}),
}


def balanced(examples: list[Example], n: int) -> list[Example]:
    """Up to `n` examples with the labels taking turns (all of them when there are many labels)."""
    by_label: dict[str, list[Example]] = collections.defaultdict(list)
    for example in examples:
        by_label[str(example.info[0])].append(example)
    if len(by_label) > 4:
        return examples[:n]
    picked: list[Example] = []
    queues = [list(v) for _, v in sorted(by_label.items())]
    while len(picked) < n and any(queues):
        for queue in queues:
            if queue and len(picked) < n:
                picked.append(queue.pop(0))
    return picked


def run(model: Model, task: str, strategy: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    proposer_names, selection, settings = STRATEGIES[strategy]
    agent = FewShotAgent(model)
    test = bigbench(task, split="test", n=args.test, seed=seed)
    validation = balanced(bigbench(task, split="validation", seed=seed), args.validation)
    proposers = [Optimizer(model, max_tokens=120, temperature=0.8) if name == "optimizer" else
                 DemoProposer(source="labels") for name in proposer_names]
    settings = dict(settings)
    if settings.get("validation") == "first":
        settings["validation"] = MinibatchFirst(validation)
    trainer = AggregatedUpdate(agent, proposers, aggregator=Aggregator(model, max_tokens=160, temperature=0.8),
                               concurrency=4, **{"validation": validation, **settings}, selection=selection)
    started = time.monotonic()
    before = evaluate(agent, ExactMatchGuide(), test, concurrency=4, max_failures=None).mean
    spent = model.usage
    with tempfile.TemporaryDirectory() as run_dir:
        result = trainer.train(ExactMatchGuide(), bigbench(task, split="train", n=args.train, seed=seed),
                               batch_size=args.batch_size, run_dir=run_dir, seed=seed, progress=False)
    used = model.usage
    after = evaluate(agent, ExactMatchGuide(), test, concurrency=4, max_failures=None).mean
    return {
        "task": task, "strategy": strategy, "seed": seed, "test_before": before, "test_after": after,
        "baseline": majority_baseline(test), "steps": result.steps, "accepted": result.accepted,
        "calls": used.calls - spent.calls, "tokens": used.total_tokens - spent.total_tokens,
        "seconds": round(time.monotonic() - started, 1), "final_demos": len(agent.demos.stored_value),
        "stopped": result.stopped_reason,
    }


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["plural", "sports_understanding"])
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--train", type=int, default=12, help="training examples (3 steps of 4)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--validation", type=int, default=24, help="validation examples, balanced by label")
    parser.add_argument("--test", type=int, default=64)
    parser.add_argument("--base-url", help="an OpenAI-compatible endpoint instead of the embedded model")
    parser.add_argument("--model", default="default", help="the model name at --base-url")
    parser.add_argument("--jsonl", help="also append every row to this JSONL file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    model: Model = OpenAIModel(args.model, base_url=args.base_url) if args.base_url else LocalModel()
    print(f"# {model.name}; {platform.machine()} {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; "
          f"train {args.train} (batch {args.batch_size}), validation {args.validation} balanced, test {args.test}")
    print("| task | strategy | seed | test before | test after | constant answer | accepted/steps "
          "| optimization calls | tokens | seconds |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    try:
        for task in args.tasks:
            for strategy in args.strategies:
                for seed in args.seeds:
                    row = run(model, task, strategy, seed, args)
                    rows.append(row)
                    print(f"| {task} | {strategy} | {seed} | {_pct(row['test_before'])} | {_pct(row['test_after'])} | "
                          f"{_pct(row['baseline'])} | {row['accepted']}/{row['steps']} | {row['calls']} | "
                          f"{row['tokens']} | {row['seconds']} |", flush=True)
                    if args.jsonl:
                        with open(args.jsonl, "a", encoding="utf-8") as handle:
                            handle.write(json.dumps(row) + "\n")
    finally:
        model.close()
    print("\n| task | strategy | test after, mean (min-max) | gain over constant answer, mean | calls, mean |")
    print("|---|---|---:|---:|---:|")
    groups: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for row in rows:
        groups[(row["task"], row["strategy"])].append(row)
    for (task, strategy), group in groups.items():
        after = [r["test_after"] or 0.0 for r in group]
        gain = [a - r["baseline"] for a, r in zip(after, group)]
        print(f"| {task} | {strategy} | {100 * statistics.mean(after):.1f} ({100 * min(after):.1f}-"
              f"{100 * max(after):.1f}) | {100 * statistics.mean(gain):+.1f} | "
              f"{statistics.mean(r['calls'] for r in group):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
