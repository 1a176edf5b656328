"""Benchmark: learning from a simulated production stream, cycle after cycle.

Production: users ask for capitals. 70% of them need the capital named (the prompt must
ask for the capital city), 40% want it in one word (the prompt must ask for one word); a
prompt that asks for French answers fails everyone who needs the capital. A user is
satisfied when every need is met, so every prompt's true quality (the share of satisfied
users) is known exactly. Each cycle, 48 requests are answered with the prompt production
serves; each user gives a thumbs up or down (10% of them the other way), a thumbs down
comes with a comment naming an unmet need 70% of the time, and 30% of users also give
the right answer.

Each cycle runs opto's production cycle on that cycle's traces: the newest quarter held
out for the final check, `train(logged=...)` from the rest with a `FeedbackGuide` (its
judge a stand-in that reads the comments, wrong 10% of the time), and the result
promoted only when the check passed (what `publish` does). The optimizer's stand-in adds
the rule for the need the comments ask for most that the prompt lacks 60% of the time,
and otherwise a harmful or useless edit (answers in French, or a politeness rule).

Beside it, MLflow's `optimize_prompts` on the same stream, run the way its docs show
(bench/production_mlflow.py): three datasets and scorers, each cycle's result registered
and served without a check, as MLflow does.

    pip install mlflow gepa                    # MLflow's side (measured: 3.17.2, gepa 0.1.4)
    python bench/production.py                 # 10 cycles, 5 seeds, about 15 minutes
    python bench/production.py --no-mlflow     # opto's two policies only, a few seconds
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from opto import Agent, AggregatedUpdate, FeedbackGuide, FinalCheck, LoggedRollout, Optimizer, Parameter, ScriptedModel
from opto.core.logged import split_newest
from opto.errors import OptoValueError

CAPITALS = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Peru": "Lima", "Japan": "Tokyo",
            "Kenya": "Nairobi", "Egypt": "Cairo", "Chile": "Santiago", "Ghana": "Accra", "Nepal": "Kathmandu",
            "Cuba": "Havana", "Fiji": "Suva", "Laos": "Vientiane", "Mali": "Bamako", "Oman": "Muscat",
            "Togo": "Lome"}  # fmt: skip
NEEDS = {"capital": 0.7, "brief": 0.4}
RULES = {"capital": "Name the capital city.", "brief": "Answer in one word."}
HARMFUL = "Answer in French."
USELESS = "Be polite."
# (production's prompt, the cycle's traces, the seed's random source, the run's name) -> (what production
# serves next, what happened)
Policy = Callable[[str, list[LoggedRollout], random.Random, str], tuple[str, str]]
COMMENTS = {"capital": "I wanted the name of the city", "brief": "too long: one word please"}


AGENT_CALLS = [0]  # the agent's answers during a policy's cycles (production's own traffic not counted)


def answer(prompt: str, country: str) -> str:
    if "capital city" not in prompt:
        return f"{country} is a lovely country."
    city = f"{country}-City" if "French" in prompt else CAPITALS[country]  # the French rule garbles the name
    return city if "one word" in prompt else f"The capital is {city}, a lovely city."


def satisfied(prompt: str, needs: set[str], country: str) -> bool:
    said = answer(prompt, country)
    ok_capital = CAPITALS[country] == said.split(",")[0].removeprefix("The capital is ").strip()
    return ("capital" not in needs or ok_capital) and ("brief" not in needs or len(said.split()) == 1)


def true_quality(prompt: str) -> float:
    """The share of satisfied users, over every combination of needs (exact)."""
    total = 0.0
    for capital in (True, False):
        for brief in (True, False):
            weight = (NEEDS["capital"] if capital else 1 - NEEDS["capital"]) * (
                NEEDS["brief"] if brief else 1 - NEEDS["brief"]
            )
            needs = {n for n, on in (("capital", capital), ("brief", brief)) if on}
            total += weight * statistics.mean(satisfied(prompt, needs, c) for c in CAPITALS)
    return total


def counted_answer(prompt: str, country: str) -> str:
    AGENT_CALLS[0] += 1
    return answer(prompt, country)


class Capitals(Agent):
    def __init__(self, prompt: str) -> None:
        self.prompt = Parameter(prompt, description="the system prompt")

    def forward(self, question: str) -> str:
        AGENT_CALLS[0] += 1
        return answer(str(self.prompt.value), question.rsplit(" ", 1)[-1].rstrip("?"))


def production_traffic(prompt: str, cycle: int, rng: random.Random, n: int = 48) -> list[LoggedRollout]:
    records = []
    for i in range(n):
        country = rng.choice(list(CAPITALS))
        needs = {need for need, share in NEEDS.items() if rng.random() < share}
        happy = satisfied(prompt, needs, country)
        thumbs = happy if rng.random() >= 0.1 else not happy
        unmet = [need for need in sorted(needs) if not satisfied(prompt, {need}, country)]
        comment = ""
        if not thumbs:
            comment = COMMENTS[rng.choice(unmet)] if unmet and rng.random() < 0.7 else "bad answer"
        records.append(LoggedRollout(
            x=f"What is the capital of {country}?", output=answer(prompt, country), score=float(thumbs),
            feedback=comment, info=CAPITALS[country] if rng.random() < 0.3 else None,
            id=f"c{cycle}-{i}", time=cycle * 1000 + i,
        ))  # fmt: skip
    return records


def judge_for(rng: random.Random) -> ScriptedModel:
    """A judge that reads the users' comments for the input and checks the output against
    them; wrong 10% of the time."""

    def reply(messages: list[dict[str, str]]) -> str:
        text = messages[-1]["content"]
        output = text.split("# Output to judge", 1)[-1].split("# Question", 1)[0]
        good = True
        if COMMENTS["capital"] in text:
            good &= any(city in output for city in CAPITALS.values())
        if COMMENTS["brief"] in text:
            good &= len(output.strip().strip('"').split()) <= 3
        if "bad answer" in text and not (COMMENTS["capital"] in text or COMMENTS["brief"] in text):
            good &= any(city in output for city in CAPITALS.values())
        if rng.random() < 0.1:
            good = not good
        asked = [comment for comment in COMMENTS.values() if comment in text]
        reason = f"The users said: {'; '.join(asked)}." if asked and not good else "It gives what the users wanted."
        return f"{reason}\nScore: " + ("10" if good else "0")

    return ScriptedModel(reply, name="judge")


def edit(current: str, asked: dict[str, int], rng: random.Random) -> str:
    """Both optimizers' stand-in edit: 60% of the time the rule for the need asked for
    most that the prompt does not have yet (the capital when nothing was asked),
    otherwise a harmful or useless rule."""
    missing = {need: count for need, count in asked.items() if RULES[need] not in current}
    wanted = max(missing, key=missing.__getitem__) if any(missing.values()) else "capital"
    if rng.random() < 0.6 and RULES[wanted] not in current:
        return f"{current} {RULES[wanted]}".strip()
    return f"{current} {rng.choice([HARMFUL, USELESS])}".strip()


def optimizer_for(rng: random.Random) -> ScriptedModel:
    """opto's optimizer: the needs its prompt shows are the users' comments."""

    def reply(messages: list[dict[str, str]]) -> str:
        text = messages[-1]["content"]
        current = json.loads(text.split("- current value: ", 1)[1].split("\n", 1)[0])
        asked = {need: text.count(comment) for need, comment in COMMENTS.items()}
        update = edit(current, asked, rng)
        return json.dumps({"reasoning": "from the users' comments", "suggestion": {"prompt": update}})

    return ScriptedModel(reply, name="optimizer")


def cycle_once(prompt: str, records: list[LoggedRollout], rng: random.Random, check: bool = True) -> tuple[str, str]:
    older, newest = split_newest(records, 0.25)
    agent = Capitals(prompt)
    guide = FeedbackGuide(judge_for(rng), records, min_agreement=0.7)
    guide.check_agreement()  # refused with the figures before any training when it disagrees with the users
    trainer = AggregatedUpdate(agent, Optimizer(optimizer_for(rng)), final_check=FinalCheck(examples=newest))
    result = trainer.train(guide, [(r.x, r.info) for r in older], batch_size=4, logged=older, seed=rng.randrange(10**6),
                           progress=False)  # fmt: skip
    verdict = result.final_check
    if not check:  # promote whatever the search ended with, as a publish without a check would
        searched = str(verdict.search_parameters["prompt"]) if verdict is not None else prompt
        return searched, "promoted" if searched != prompt else "unchanged"
    found = str(result.final_parameters["prompt"])
    if verdict is not None and verdict.returned == "final" and found != prompt:
        return found, "promoted"
    return prompt, f"refused ({verdict.reason if verdict is not None else 'no check'})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--no-mlflow", action="store_true", help="run opto's two policies only")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    policies: dict[str, Policy] = {
        "opto: promoted only when the final check passed (publish)": lambda p, r, rng, run: cycle_once(p, r, rng),
        "opto: promoted whatever the search returned (no check)": lambda p, r, rng, run: cycle_once(p, r, rng, False),
    }
    with contextlib.ExitStack() as stack:
        if not args.no_mlflow:
            policies.update(mlflow_policies(stack))
        summary = []
        for policy, decide in policies.items():
            started, AGENT_CALLS[0] = time.perf_counter(), 0
            rows = run_policy(args, policy, decide)
            summary.append((policy, rows, AGENT_CALLS[0] / len(rows), time.perf_counter() - started))
            table(policy, rows, args.cycles)
    print("\n| policy | final mean true quality | promotions | promotions that lowered it | agent calls a cycle | "
          "seconds |\n|---|---|---|---|---|---|")  # fmt: skip
    for policy, rows, calls, seconds in summary:
        final = statistics.mean(r["after"] for r in rows if r["cycle"] == args.cycles)
        promoted = sum(1 for r in rows if r["what"] == "promoted")
        worse = sum(1 for r in rows if r["after"] < r["before"] - 1e-9)
        print(f"| {policy} | {final:.3f} | {promoted} | {worse} | {calls:.0f} | {seconds:.0f} |")


def mlflow_policies(stack: contextlib.ExitStack) -> dict[str, Policy]:
    """MLflow's `optimize_prompts` on the same stream (bench/production_mlflow.py)."""
    missing = [name for name in ("mlflow", "gepa", "litellm") if importlib.util.find_spec(name) is None]
    if missing:
        sys.exit(f"MLflow's side needs `pip install mlflow gepa` ({', '.join(missing)} not installed); "
                 "or run with --no-mlflow")  # fmt: skip
    from production_mlflow import MLflowStream

    stream = stack.enter_context(MLflowStream(counted_answer, CAPITALS, edit).running())
    return {
        "MLflow optimize_prompts: every trace (recorded outputs, expected answers where given)":
            lambda p, r, rng, run: stream.cycle(p, r, f"all-{run}", r[0].time // 1000, expected_only=False),
        "MLflow optimize_prompts: only the traces with an expected answer":
            lambda p, r, rng, run: stream.cycle(p, r, f"expected-{run}", r[0].time // 1000, expected_only=True),
        "MLflow optimize_prompts: only the traces with an expected answer, exact-match scorer":
            lambda p, r, rng, run: stream.cycle(p, r, f"exact-{run}", r[0].time // 1000, expected_only=True,
                                                exact=True),
    }  # fmt: skip


def run_policy(args: argparse.Namespace, policy: str, decide: Policy) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for seed in range(args.seeds):
        rng, users = random.Random(seed), random.Random(f"users-{seed}")  # the same users for every policy
        prompt = "Answer the question."
        for cycle in range(1, args.cycles + 1):
            before = true_quality(prompt)
            records = production_traffic(prompt, cycle, users)
            try:
                prompt, what = decide(prompt, records, rng, f"seed{seed}")
            except OptoValueError as exc:  # a refused judge: production keeps its prompt
                what = f"refused ({str(exc)[:120]})"
            rows.append({"seed": seed, "cycle": cycle, "before": before, "after": true_quality(prompt), "what": what,
                         "prompt": prompt})  # fmt: skip
            print(f"{policy[:40]} seed {seed} cycle {cycle}: {before:.3f} -> {rows[-1]['after']:.3f} {what[:100]}",
                  file=sys.stderr)  # fmt: skip
    return rows


def table(policy: str, rows: list[dict[str, Any]], cycles: int) -> None:
    seeds = len({r["seed"] for r in rows})
    print(f"\n{policy}, {seeds} seeds:\n")
    print("| cycle | mean true quality before | after | promoted | promotions that lowered it |")
    print("|---|---|---|---|---|")
    for cycle in range(1, cycles + 1):
        these = [r for r in rows if r["cycle"] == cycle]
        worse = sum(1 for r in these if r["after"] < r["before"] - 1e-9)
        promoted = sum(1 for r in these if r["what"] == "promoted")
        print(f"| {cycle} | {statistics.mean(r['before'] for r in these):.3f} | "
              f"{statistics.mean(r['after'] for r in these):.3f} | {promoted}/{len(these)} | {worse} |")  # fmt: skip
    worse = sum(1 for r in rows if r["after"] < r["before"] - 1e-9)
    final = [r["after"] for r in rows if r["cycle"] == cycles]
    print(f"\nbest possible quality {true_quality(RULES['capital'] + ' ' + RULES['brief']):.3f}; "
          f"final mean {statistics.mean(final):.3f}; promotions that lowered the true quality: {worse}")  # fmt: skip


if __name__ == "__main__":
    main()
