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

Five more, each made to reproduce a weakness of the final check an earlier test found.
"Decent start A" holds good rules for classes 0, 3 and 4 and a fair one for class 1, "B"
good ones for 0, 1 and 3 and a fair one for 4: both of true value 0.675, 5.8 points below
the attainable 0.733 (one good rule for a fair one is the smallest step this landscape
has). For a deterministic agent a rule's tag fixes which items it gets right, so A and B
are lucky or unlucky on different examples. "The harmful optimizer" is good-start's (good
rules 15% of the time, 40% of fixes break another rule).

- t0-good-start: a deterministic agent (temperature 0: the hash-based answers), decent
  start A, the harmful optimizer; 48 train + 24 validation. With fewer than 96 examples
  the check reserves none and runs again the very examples the search chose on, once (the
  agent is not noisy, so once is all it does).
- long-run-24: a deterministic agent, 24 training examples (4 a class), no validation set
  (a winner is raced on the same 24), decent start A, the harmful optimizer, and its own
  budget of 4500 calls: about 500 steps (the column "steps" says how many were made;
  GEPA's: its iterations). opto's epochs (200) are enough for the budget to end the run.
- val-8: a deterministic agent, 48 training examples, a validation set of 8 (item 100 of
  every class, then item 101 of classes 0 and 1), decent start B, the harmful optimizer.
- large-240: a sampling agent, 240 training examples (40 a class: the check reserves 60 of
  them, which the search never sees), 24 validation, decent start A, the usual optimizer.
- skewed-mix: the sample's class mix is not the task's: classes 0, 1, 3 and 4 weigh 5 to
  classes 2 and 5's 2 (48 train: 10, 10, 4, 10, 10, 4 a class; 24 validation: 5, 5, 2, 5,
  5, 2); the true value still weighs all six alike. The start is at the attainable value
  with the good rules of classes 0, 2, 3 and 5, so a rule for the over-represented class 1
  (4) pushes class 2's (5's) out of the room: a fair one is truly 5.8 points worse, yet
  scores better on this sample. The harmful optimizer (mostly fair rules), a sampling
  agent. This row shows a limit, not a target: no check on the sample can see the loss
  (the table says so above the rows).

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
runs that return the start values unchanged, the search's own gain (the values opto's
search ended with, before its final check; GEPA has no check: its are those returned) and
the runs where those were more than 1 point below the start (beside the runs returned
below it: what the check let through), and the calls spent (all of them: the step that
crosses the budget and anything the search does after it included).

    pip install gepa==0.1.4
    python bench/robustness.py                      # all scenarios, 20 seeds, 1500 calls (unless said)
    python bench/robustness.py --scenarios copies small --seeds 3 --budget 600 --only default gepa
    python bench/robustness.py --only default gepa --scenarios t0-good-start long-run-24 val-8 large-240 skewed-mix

--budget applies to every scenario; without it each runs on its own budget (long-run-24's
4500 calls) or 1500 calls.

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

DEFAULT_BUDGET = 1500  # calls a run may spend, unless the scenario or --budget says otherwise

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
    steps: int = 0  # opto's steps, GEPA's iterations


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
                           num_epochs=scenario.num_epochs, seed=seed, progress=False, stop=MaxCalls(budget))
    values = {name: result.final_parameters[name] for name in landscape.parts}
    check = getattr(result, "final_check", None)  # None also for opto before the final check
    searched = check.search_parameters if check else result.final_parameters
    return outcome(scenario, values, sum(c.calls for c in counters), {name: searched[name] for name in landscape.parts},
                   steps=result.steps)


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

    landscape, calls, iterations = scenario.landscape, [0], [0]

    def stop(state: Any) -> bool:  # GEPA asks before each iteration
        iterations[0] += 1
        return calls[0] >= budget

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
        stop_callbacks=[stop],
        seed=seed,
        display_progress_bar=False,
        logger=_Quiet(),
        raise_on_exception=True,
    )
    return outcome(scenario, dict(result.best_candidate), calls[0], steps=iterations[0] - 1)


def outcome(scenario: Scenario, values: dict[str, str], calls: int, searched: dict[str, str] | None = None,
            steps: int = 0) -> Outcome:
    start = scenario.true_value(scenario.start_values())
    gain = 100 * (scenario.true_value(values) - start)
    search_gain = gain if searched is None else 100 * (scenario.true_value(searched) - start)
    return Outcome(gain, calls, scenario.copies_share(values), values == scenario.start_values(), search_gain, steps)


def budget_of(scenario: Scenario, budget: int | None) -> int:
    """The calls a run may spend: --budget when given, else the scenario's own, else 1500."""
    return budget if budget is not None else scenario.budget or DEFAULT_BUDGET


def run(scenario: str, row: str, seed: int, budget: int | None) -> Outcome:
    """One run, self-contained (a process pool's task)."""
    logging.disable(logging.WARNING)  # opto's per-run notices; the table says what matters
    found = SCENARIOS[scenario]
    if row == "gepa":
        return run_gepa(found, seed, budget_of(found, budget))
    return run_opto(found, row, seed, budget_of(found, budget))


def table(scenario: Scenario, results: dict[str, list[Outcome]], budget: int) -> list[str]:
    copies = scenario.name == "copies"
    steps = scenario.budget is not None  # a scenario with its own budget is about how long a run is
    start = scenario.true_value(scenario.start_values())
    train, valset = scenario.train_set(), scenario.validation_set()
    data = f"{len(train)} train{scenario.describe_sample(train)}, " + (
        f"{len(valset)} validation{scenario.describe_sample(valset)}" if valset else "no validation set")
    own = f", budget {budget} calls" if budget != DEFAULT_BUDGET else ""
    lines = [f"### {scenario.name}: {data}, start true value {start:.3f}, attainable "
             f"{scenario.landscape.attainable:.3f}{own}", "",
             *([f"**A limit, not a target:** {scenario.limit}", ""] if scenario.limit else []),
             "| row | true value returned (mean) | mean true gain (points) | runs > 1 point below start | "
             "worst run's gain | runs returning the start | search's own gain (mean) | "
             "runs whose search ended > 1 point below start | calls spent (mean) |"
             f"{' room held by copies (mean) |' if copies else ''}{' steps (mean) |' if steps else ''}",
             f"|---|---:|---:|---:|---:|---:|---:|---:|---:|{'---:|' if copies else ''}{'---:|' if steps else ''}"]
    for row, outcomes in results.items():
        gains = [o.gain for o in outcomes]
        label = ROWS[row] + (" = default (no validation set)" if row == "best" and valset is None else "")
        line = (f"| {label} | {start + statistics.fmean(gains) / 100:.3f} | {statistics.fmean(gains):+.1f} | "
                f"{sum(g < -1 for g in gains)}/{len(gains)} | {min(gains):+.1f} | "
                f"{sum(o.unchanged for o in outcomes)}/{len(outcomes)} | "
                f"{statistics.fmean(o.search_gain for o in outcomes):+.1f} | "
                f"{sum(o.search_gain < -1 for o in outcomes)}/{len(outcomes)} | "
                f"{statistics.fmean(o.calls for o in outcomes):.0f} |")
        lines.append(line + (f" {statistics.fmean(o.copies for o in outcomes):.0%} |" if copies else "")
                     + (f" {statistics.fmean(o.steps for o in outcomes):.0f} |" if steps else ""))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenarios", nargs="*", default=list(SCENARIOS), choices=list(SCENARIOS))
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--budget", type=int, default=None,
                        help=f"calls a run may spend (default: the scenario's own, else {DEFAULT_BUDGET})")
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
        out += table(SCENARIOS[name], results, budget_of(SCENARIOS[name], args.budget)) + [""]
    budget = (f"budget {args.budget} calls" if args.budget is not None
              else f"budget {DEFAULT_BUDGET} calls unless a scenario has its own")
    print(f"{args.seeds} seeds, {budget}, batch 4 (opto); Python {platform.python_version()}, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {args.jobs} jobs, wall time "
          f"{time.time() - started:.0f} s\n")
    print("\n".join(out))


if __name__ == "__main__":
    sys.exit(main())
