"""Benchmark: search strategies, opto's and GEPA's, on simulated tasks where search matters.

The tasks (`bench/landscapes.py`): examples of K classes, one text parameter per part of
the classes, each a list of rules of which the agent reads only the first 2 (rules
compete for room); a scripted optimizer that writes a good rule for a failed example's
class with some probability (a fair one otherwise) and sometimes breaks another rule; an
aggregator that merges carelessly. "two-part": 6 classes, 2 parameters, good rules half
the time, a quarter of fixes break another rule. "three-part": 8 classes, 3 parameters,
good rules 35% of the time, 40% of fixes break another.

Every opto call goes through opto's real trainer and prompts (`ScriptedModel` functions
read them); GEPA (`gepa.optimize`, its defaults) runs the same examples, agent and
optimizer behind a `GEPAAdapter` and its `reflection_lm`; the bridge row runs that same
adapter through `opto.integrations.gepa.optimize` with opto's defaults (the same settings
as the "default" row). Calls are counted the same way:
one per example evaluated (agent runs), one per optimizer, reflection or aggregator call.
The values a run would end with are scored by their expected accuracy on the validation
set, which costs no call. Reported per strategy over the seeds: the calls until those
values reach 90% of the attainable score and keep it (never below it again within the
budget), how many runs got there, and the score at the budget.

    pip install gepa==0.1.4                 # the GEPA and bridge rows (opto's gepa extra)
    python bench/search.py                  # both landscapes, 20 seeds, 3000 calls
    python bench/search.py --landscapes two-part --seeds 5 --only default gepa
    python bench/search.py --only default bridge   # opto's default, natively and through the bridge
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gepa_rows import LandscapeAdapter, run_gepa  # noqa: E402
from landscapes import ITEM, LANDSCAPES, Landscape, failures_in, prompt_of, rules_of  # noqa: E402

from opto import Agent, AggregatedUpdate, Callback, ExactMatchGuide, MaxCalls, MinibatchFirst, Optimizer  # noqa: E402
from opto.search.validation import DatasetValidation  # noqa: E402
from opto import Parameter, ScriptedModel, StopCondition  # noqa: E402
from opto.integrations.gepa import optimize  # noqa: E402

Curve = list[tuple[int, float]]


class RuleAgent(Agent):
    """One text parameter per part; its model reads them as JSON in the system message."""

    def __init__(self, model: ScriptedModel, landscape: Landscape) -> None:
        self.model = model
        for name, classes in landscape.parts.items():
            setattr(self, name, Parameter("", description=f"rules for classes {classes}, most important first"))

    async def forward(self, x: str) -> str:
        values = {name: param.value for name, param in self.named_parameters().items()}
        reply = await self.model.complete([{"role": "system", "content": json.dumps(values)},
                                           {"role": "user", "content": x}])
        return reply.text


def agent_reply(landscape: Landscape) -> Callable[[list[dict[str, Any]]], str]:
    return lambda messages: landscape.answer(json.loads(messages[0]["content"]), messages[-1]["content"])


def editable_values(text: str) -> dict[str, str]:
    """The current values of the parameters an optimizer prompt lets it change."""
    found = {}
    parameters = re.split(r"\n# (?:Examples|Input)\n", text.split("# Parameters", 1)[1])[0]
    for block in re.split(r"\n## ", parameters)[1:]:
        name = block.split("\n", 1)[0].strip()
        value = re.search(r"- current value: (\".*\")", block)
        if value and "- trainable: yes" in block:
            found[name] = json.loads(value.group(1))
    return found


def optimizer_reply(landscape: Landscape, seed: int) -> Callable[[list[dict[str, Any]]], str]:
    """The scripted optimizer behind opto's prompts: per instance (one example shown) or
    reflective (several): it fixes the first failure of a class it may change."""

    def reply(messages: list[dict[str, Any]]) -> str:
        text = messages[-1]["content"]
        current = editable_values(text)
        if "# Examples" in text:  # the reflective prompt
            failures = failures_in(text)
        else:
            shown = ITEM.search(text.split("# Input", 1)[1])
            failed = not re.search(r"score: 1(\.0)?\b", text)
            failures = [tuple(map(int, shown.groups()))] if failed else []
        suggestion = landscape.reflect(current, failures, seed)  # type: ignore[arg-type]
        reasoning = "a rule for a failed class" if suggestion else "nothing to fix"
        return json.dumps({"reasoning": reasoning, "suggestion": suggestion})

    return reply


def aggregator_reply(landscape: Landscape, parse: Callable[[str], list[Any]] = rules_of,
                     render: Callable[[list[Any]], str] = prompt_of,
                     key: Callable[[Any], Any] = lambda rule: rule[0]) -> Callable[[list[dict[str, Any]]], str]:
    """A careless merge: every suggestion's changes in order, the later winning, each changed
    entry moved to the front (`parse` reads a part's entries, `render` writes them, `key`
    says which entries replace each other: a rule replaces its class's rule)."""

    def reply(messages: list[dict[str, Any]]) -> str:
        blocks = re.split(r"# Suggestion \d+", messages[-1]["content"])[1:]
        suggestion = {}
        for name in landscape.parts:
            values = [json.loads(found.group(1)) for block in blocks
                      if (found := re.search(rf'"{name}": (".*")', block))]
            if not values:
                continue
            merged = parse(values[0])
            for value in values[1:]:
                current = {key(entry): entry for entry in merged}
                for entry in reversed(parse(value)):
                    if current.get(key(entry)) != entry:
                        merged = [entry, *[e for e in merged if key(e) != key(entry)]]
            suggestion[name] = render(merged)
        return json.dumps({"reasoning": "all changes", "suggestion": suggestion})

    return reply


# opto's rows: AggregatedUpdate keywords, and for validation on the benchmark's validation
# set "set" (DatasetValidation) or "first" (MinibatchFirst), with "race" and "ties" for it;
# no "validation" key: opto's default (a split held out from the training data).
PER_INSTANCE = {"proposals": "per_instance"}
REFLECTIVE_BEST = {"validation": "first", "race": 8, "ties": True}
STRATEGIES: dict[str, dict[str, Any]] = {
    "default": {},
    "old default (per instance, minibatch)": {**PER_INSTANCE, "validation": "minibatch"},
    "per instance, valset": {**PER_INSTANCE, "validation": "set"},
    "per instance, first": {**PER_INSTANCE, "validation": "first"},
    "per instance, pareto, valset": {**PER_INSTANCE, "selection": "pareto", "validation": "set"},
    "per instance, pareto, merge": {**PER_INSTANCE, "selection": "pareto", "validation": "set", "merge_every": 3},
    "per instance, each, skip, first+race+ties": {**PER_INSTANCE, "candidates": "each", "skip_perfect": True,
                                                  **REFLECTIVE_BEST},
    "reflective, first": {"validation": "first"},
    "reflective, first+race+ties": REFLECTIVE_BEST,
    "reflective, round robin, first+race+ties": {"components": "round_robin", **REFLECTIVE_BEST},
    "reflective, pareto, first+race+ties": {"selection": "pareto", **REFLECTIVE_BEST},
    "reflective, epsilon-greedy, first+race+ties": {"selection": "epsilon_greedy", **REFLECTIVE_BEST},
    "reflective, top-k, first+race+ties": {"selection": "top_k", **REFLECTIVE_BEST},
}
GEPA_ROWS = {"GEPA defaults": {}, "GEPA use_merge=True": {"use_merge": True}}


class Counted:
    """A reply function that counts its calls."""

    def __init__(self, fn: Callable[[list[dict[str, Any]]], str]) -> None:
        self.fn, self.calls = fn, 0

    def __call__(self, messages: list[dict[str, Any]]) -> str:
        self.calls += 1
        return self.fn(messages)


def without_class(examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k != "class"} for e in examples]


def run_opto(landscape: Landscape, strategy: str, seed: int, budget: int, batch_size: int) -> Curve:
    settings = dict(STRATEGIES[strategy])
    batch_size = settings.pop("batch_size", batch_size)
    skip_perfect = settings.pop("skip_perfect", False)
    validation = landscape.validation_set()
    rows = without_class(validation)
    kind = settings.pop("validation", None)
    race, ties = settings.pop("race", None), settings.pop("ties", False)
    if kind is not None:
        settings["validation"] = {"minibatch": "minibatch", "set": DatasetValidation(rows, race=race, accept_ties=ties),
                                  "first": MinibatchFirst(rows, race=race, accept_ties=ties)}[kind]
    counters = [Counted(fn) for fn in (agent_reply(landscape), optimizer_reply(landscape, seed),
                                        aggregator_reply(landscape))]
    agent = RuleAgent(ScriptedModel(counters[0], name="agent"), landscape)
    trainer = AggregatedUpdate(agent, Optimizer(ScriptedModel(counters[1], name="optimizer"), skip_perfect=skip_perfect),
                               llm=ScriptedModel(counters[2], name="aggregator"), **settings)
    curve: Curve = []

    class Watch(Callback):
        def on_step_end(self, record: Any) -> None:
            curve.append((sum(c.calls for c in counters),
                          landscape.expected_score(trainer.final_values(), validation)))

    trainer.train(ExactMatchGuide(), without_class(landscape.train_set()), batch_size=batch_size, num_epochs=100,
                  seed=seed, progress=False, stop=MaxCalls(budget), callbacks=[Watch()])
    return curve


class CallsSpent(StopCondition):
    """Stops once `spent()` calls (the adapter's evaluations and the model calls) reach `budget`."""

    def __init__(self, spent: Callable[[], int], budget: int) -> None:
        self.spent, self.budget = spent, budget

    def check(self, progress: Any) -> str | None:
        return f"{self.spent()} calls" if self.spent() >= self.budget else None


def run_bridge(landscape: Landscape, seed: int, budget: int, batch_size: int) -> Curve:
    """opto's default through `opto.integrations.gepa.optimize`, with the GEPA rows' adapter:
    one call per example the adapter evaluates, one per optimizer or aggregator call."""
    evaluated = [0]
    counters = [Counted(fn) for fn in (optimizer_reply(landscape, seed), aggregator_reply(landscape))]
    validation = landscape.validation_set()
    curve: Curve = []
    spent = lambda: evaluated[0] + sum(c.calls for c in counters)  # noqa: E731
    trainer: list[Any] = []

    class Watch(Callback):
        def on_train_start(self, found: Any, config: dict[str, Any]) -> None:
            trainer.append(found)

        def on_step_end(self, record: Any) -> None:
            curve.append((spent(), landscape.expected_score(trainer[0].final_values(), validation)))

    optimize({name: "" for name in landscape.parts}, without_class(landscape.train_set()),
             adapter=LandscapeAdapter(landscape, evaluated), model=ScriptedModel(counters[0], name="optimizer"),
             llm=ScriptedModel(counters[1], name="aggregator"), batch_size=batch_size, num_epochs=100, seed=seed,
             stop=CallsSpent(spent, budget), callbacks=[Watch()])
    return curve


BRIDGE_ROWS = {"default, through opto.integrations.gepa": run_bridge}


def kept_at(curve: Curve, target: float, budget: int) -> int | None:
    """The calls after which the values never fell below `target` again within the budget."""
    within = [(calls, score) for calls, score in curve if calls <= budget]
    below = [i for i, (_, score) in enumerate(within) if score < target]
    if not within or (below and below[-1] + 1 >= len(within)):
        return None
    return within[below[-1] + 1][0] if below else within[0][0]


def score_at(curve: Curve, budget: int) -> float:
    within = [score for calls, score in curve if calls <= budget]
    return within[-1] if within else 0.0


def table(landscape: Landscape, names: list[str], seeds: int, budget: int, batch_size: int) -> list[str]:
    target = 0.9 * landscape.attainable
    lines = [f"### {landscape.name}: attainable {landscape.attainable:.3f}, the mark (90%) {target:.3f}", "",
             "| strategy | runs that reach the mark and keep it | calls until kept (mean +- sd) | score at budget "
             "(mean +- sd) |", "|---|---:|---:|---:|"]
    for name in names:
        curves = [run_gepa(landscape, seed, budget, **GEPA_ROWS[name]) if name in GEPA_ROWS
                  else BRIDGE_ROWS[name](landscape, seed, budget, batch_size) if name in BRIDGE_ROWS
                  else run_opto(landscape, name, seed, budget, batch_size) for seed in range(seeds)]
        kept = [k for k in (kept_at(c, target, budget) for c in curves) if k is not None]
        scores = [score_at(c, budget) for c in curves]
        calls = f"{statistics.fmean(kept):.0f} +- {statistics.pstdev(kept):.0f}" if kept else "-"
        lines.append(f"| {name} | {len(kept)}/{seeds} | {calls} | {statistics.fmean(scores):.3f} +- "
                     f"{statistics.pstdev(scores):.3f} |")
        print(lines[-1], file=sys.stderr, flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--landscapes", nargs="*", default=list(LANDSCAPES), choices=list(LANDSCAPES))
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--budget", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--only", nargs="*", default=None,
                        help="strategy names (GEPA rows: 'gepa'; the bridge row: 'bridge')")
    args = parser.parse_args()
    names = [*STRATEGIES, *BRIDGE_ROWS, *GEPA_ROWS]
    if args.only:
        names = [n for n in names if n in args.only or (n in GEPA_ROWS and "gepa" in args.only)
                 or (n in BRIDGE_ROWS and "bridge" in args.only)]
    started = time.time()
    out = []
    for name in args.landscapes:
        out += table(LANDSCAPES[name], names, args.seeds, args.budget, args.batch_size) + [""]
    print(f"{args.seeds} seeds, budget {args.budget} calls, batch {args.batch_size}; Python "
          f"{platform.python_version()}, load {os.getloadavg()[0]:.2f}, {time.time() - started:.0f} s\n")
    print("\n".join(out))


if __name__ == "__main__":
    sys.exit(main())
