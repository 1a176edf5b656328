"""Benchmark: does a search return values truly better than it started from, when what it
sees on its data misleads it? opto's default, opto's documented best and GEPA's defaults.

Every scenario is the "two-part" landscape of `bench/landscapes.py` (six classes "c0".."c5",
two text parameters `rules_a` (classes 0-2) and `rules_b` (3-5) of which the agent reads
the first 2 entries; a rule's accuracy: good 0.95, fair 0.6, bad 0.1, no rule 0.3; the
scripted optimizer writes a good rule for a failed class half the time, else a fair one,
and a quarter of its fixes also turn another rule of the part bad), bent one way
(`bench/robust_scenarios.py`). A value's TRUE value is its expected accuracy over all
six classes equally (unseen items), known exactly. Start values are empty unless said.

- sampling: the agent samples: each call is right with its class's rule's accuracy, drawn
  afresh (not a fixed hash). 48 training examples (8 a class), the user's validation set
  of 24 (4 a class, other items).
- noisy-judge: a deterministic agent (a hash of rule and item: temperature 0), a judge
  that flips each score (1 <-> 0) with probability 0.15. 48 train + 24 validation.
- good-start: the start already holds 2 good rules in each part (classes 0, 1, 3, 4: the
  attainable value, 0.733); an optimizer that mostly hurts (good rules 15% of the time,
  40% of fixes break another rule; its fixes put a rule in front, pushing a good rule out
  of the room); a sampling agent. 48 train + 24 validation.
- small: a sampling agent, 12 training examples (2 a class), no validation set.
- copies: a deterministic agent, 24 training examples (4 a class), no validation set; half
  the optimizer's fixes (a draw per prompt) copy the failed example ("c3 item 7 =>
  answer-c3-7") to the front of its part instead of a rule: the agent then gets that item
  right, and nothing else, and the copy takes a slot of the room. Copies are worth nothing
  on unseen items; the column "room held by copies" is their share of the returned values'
  4 slots.
- two-stage: the two parameters are two stages of a pipeline and the feedback blames the
  wrong stage half the time: shown a failure of class c, the optimizer writes its rule
  into the other part with probability 0.5 (there the agent ignores it for c, but it takes
  room). A deterministic agent, 48 train + 24 validation.

Rows, each with the same call budget (one call per agent run, i.e. per example evaluated,
one per optimizer, reflection or aggregator call, counted as in `bench/search.py`):
"default" is `AggregatedUpdate(agent, Optimizer(model), llm=model)` with no search option
(given the user's validation set as `validation=<the list of dicts>` when there is one),
batch 4, `stop=MaxCalls(budget)`; "best" passes `validation=MinibatchFirst(valset,
alpha=0.05, race=8, accept_ties=True)` instead (with no validation set it is "default");
"gepa" is `gepa.optimize` with its defaults on the same examples, agent, judge and
optimizer (`valset=None` when the user has none: GEPA then validates on the training
set), stopped by a callback once the budget is spent. Reported per scenario and row over
the seeds: the mean true value returned, the mean true gain (returned minus start,
points), the runs that end more than 1 point below the start, the worst run's gain, the
runs that return the start values unchanged, and the calls spent (all of them: the step
that crosses the budget and anything the search does after it included).

    pip install gepa==0.1.4
    python bench/robustness.py                      # all scenarios, 20 seeds, 1500 calls
    python bench/robustness.py --scenarios copies small --seeds 3 --budget 600 --only default gepa

A run is deterministic given its seed (the sampling agent's and the judge's draws are
seeded by the seed, what is drawn for, and how often it was drawn before).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gepa_rows import LandscapeAdapter, _import_gepa, _Quiet, scripted_reflection  # noqa: E402
from robust_scenarios import SCENARIOS, NoisyJudge, Scenario, aggregator_reply  # noqa: E402
from search import Counted, RuleAgent, optimizer_reply, without_class  # noqa: E402

from opto import AggregatedUpdate, MaxCalls, MinibatchFirst, Optimizer, ScriptedModel  # noqa: E402

ROWS = {
    "default": "opto default",
    "best": "opto best (MinibatchFirst alpha=0.05, race=8, ties)",
    "gepa": "GEPA 0.1.4 defaults",
}


@dataclass(frozen=True)
class Outcome:
    gain: float  # true value returned minus true value at the start, in points
    calls: int
    copies: float  # share of the returned values' room held by copied examples
    unchanged: bool  # the returned values are the start values
    search_gain: float  # the values the search ended with (before opto's final check), in points


def run_opto(scenario: Scenario, row: str, seed: int, budget: int) -> Outcome:
    landscape, answer = scenario.landscape, scenario.agent(seed)
    counters = [Counted(lambda messages: answer(json.loads(messages[0]["content"]), messages[-1]["content"])),
                Counted(optimizer_reply(landscape, seed)), Counted(aggregator_reply(landscape))]
    agent = RuleAgent(ScriptedModel(counters[0], name="agent"), landscape)
    for name, value in scenario.start_values().items():
        getattr(agent, name).value = value
    options: dict[str, Any] = {}
    if (valset := scenario.validation_set()) is not None:
        rows = without_class(valset)
        options["validation"] = MinibatchFirst(rows, alpha=0.05, race=8, accept_ties=True) if row == "best" else rows
    trainer = AggregatedUpdate(agent, Optimizer(ScriptedModel(counters[1], name="optimizer")),
                               llm=ScriptedModel(counters[2], name="aggregator"), **options)
    result = trainer.train(NoisyJudge(scenario.judge(seed)), without_class(scenario.train_set()), batch_size=4,
                           num_epochs=100, seed=seed, progress=False, stop=MaxCalls(budget))
    values = {name: result.final_parameters[name] for name in landscape.parts}
    check = getattr(result, "final_check", None)  # None also for opto before the final check
    searched = check.search_parameters if check else result.final_parameters
    return outcome(scenario, values, sum(c.calls for c in counters), {name: searched[name] for name in landscape.parts})


class ScenarioAdapter(LandscapeAdapter):
    """GEPA's adapter over a scenario: its agent and judge; each example evaluated is one call."""

    def __init__(self, scenario: Scenario, seed: int, calls: list[int]) -> None:
        super().__init__(scenario.landscape, calls)
        self.answer, self.score = scenario.agent(seed), scenario.judge(seed)

    def evaluate(self, batch: list[dict[str, Any]], candidate: dict[str, str], capture_traces: bool = False) -> Any:
        from gepa.core.adapter import EvaluationBatch

        self.calls[0] += len(batch)
        outputs = [self.answer(candidate, e["x"]) for e in batch]
        scores = [self.score(e["x"], out, e["info"]) for out, e in zip(outputs, batch)]
        return EvaluationBatch(outputs=outputs, scores=scores,
                               trajectories=list(zip(batch, outputs, scores)) if capture_traces else None)


def run_gepa(scenario: Scenario, seed: int, budget: int) -> Outcome:
    """`gepa.optimize` with its defaults, as `bench/gepa_rows.py` runs it, from the scenario's
    start, on its training set and the user's validation set (None when there is none)."""
    gepa = _import_gepa()
    from gepa.strategies.instruction_proposal import InstructionProposalSignature

    landscape, calls = scenario.landscape, [0]

    reflection_lm = scripted_reflection(landscape, seed, calls)

    template = InstructionProposalSignature.default_prompt_template
    result = gepa.optimize(
        seed_candidate=scenario.start_values(),
        trainset=scenario.train_set(),
        valset=scenario.validation_set(),
        adapter=ScenarioAdapter(scenario, seed, calls),
        reflection_lm=reflection_lm,
        reflection_prompt_template={name: f"You are changing the parameter {name}.\n{template}"
                                    for name in landscape.parts},
        stop_callbacks=[lambda state: calls[0] >= budget],
        seed=seed,
        display_progress_bar=False,
        logger=_Quiet(),
        raise_on_exception=True,
    )
    return outcome(scenario, dict(result.best_candidate), calls[0])


def outcome(scenario: Scenario, values: dict[str, str], calls: int, searched: dict[str, str] | None = None) -> Outcome:
    start = scenario.true_value(scenario.start_values())
    gain = 100 * (scenario.true_value(values) - start)
    search_gain = gain if searched is None else 100 * (scenario.true_value(searched) - start)
    return Outcome(gain, calls, scenario.copies_share(values), values == scenario.start_values(), search_gain)


def run(scenario: str, row: str, seed: int, budget: int) -> Outcome:
    """One run, self-contained (a process pool's task)."""
    logging.disable(logging.WARNING)  # opto's per-run notices; the table says what matters
    if row == "gepa":
        return run_gepa(SCENARIOS[scenario], seed, budget)
    return run_opto(SCENARIOS[scenario], row, seed, budget)


def table(scenario: Scenario, results: dict[str, list[Outcome]], budget: int) -> list[str]:
    copies = scenario.name == "copies"
    start = scenario.true_value(scenario.start_values())
    valset = scenario.validation_set()
    data = f"{len(scenario.train_set())} train, " + (f"{len(valset)} validation" if valset else "no validation set")
    lines = [f"### {scenario.name}: {data}, start true value {start:.3f}, attainable "
             f"{scenario.landscape.attainable:.3f}", "",
             "| row | true value returned (mean) | mean true gain (points) | runs > 1 point below start | "
             "worst run's gain | runs returning the start | search's own gain (mean) | calls spent (mean) |"
             f"{' room held by copies (mean) |' if copies else ''}",
             f"|---|---:|---:|---:|---:|---:|---:|---:|{'---:|' if copies else ''}"]
    for row, outcomes in results.items():
        gains = [o.gain for o in outcomes]
        label = ROWS[row] + (" = default (no validation set)" if row == "best" and valset is None else "")
        line = (f"| {label} | {start + statistics.fmean(gains) / 100:.3f} | {statistics.fmean(gains):+.1f} | "
                f"{sum(g < -1 for g in gains)}/{len(gains)} | {min(gains):+.1f} | "
                f"{sum(o.unchanged for o in outcomes)}/{len(outcomes)} | "
                f"{statistics.fmean(o.search_gain for o in outcomes):+.1f} | "
                f"{statistics.fmean(o.calls for o in outcomes):.0f} |")
        lines.append(line + (f" {statistics.fmean(o.copies for o in outcomes):.0%} |" if copies else ""))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenarios", nargs="*", default=list(SCENARIOS), choices=list(SCENARIOS))
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--budget", type=int, default=1500)
    parser.add_argument("--only", nargs="*", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (processes)")
    args = parser.parse_args()
    started = time.time()
    # "best" without a validation set is "default": run once, reported under both.
    tasks = [(name, row, seed) for name in args.scenarios for row in args.only for seed in range(args.seeds)
             if not (row == "best" and "default" in args.only and SCENARIOS[name].val_per_class == 0)]
    with ProcessPoolExecutor(args.jobs) as pool:
        done = dict(zip(tasks, pool.map(run, *zip(*tasks), [args.budget] * len(tasks))))
    out = []
    for name in args.scenarios:
        results = {row: [done.get((name, row, seed)) or done[(name, "default", seed)] for seed in range(args.seeds)]
                   for row in args.only}
        out += table(SCENARIOS[name], results, args.budget) + [""]
    print(f"{args.seeds} seeds, budget {args.budget} calls, batch 4 (opto); Python {platform.python_version()}, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {args.jobs} jobs, wall time "
          f"{time.time() - started:.0f} s\n")
    print("\n".join(out))


if __name__ == "__main__":
    sys.exit(main())
