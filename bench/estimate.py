"""Benchmark: the cost estimate before a run against what the run then spends.

`trainer.estimate(guide, data, **options)` (2 sample rollouts, one proposal, one
aggregation) and then `trainer.train(guide, data, **options)` on the offline fake server,
every model priced (agent $0.15/$0.60, optimizer and aggregator $2.50/$10 per million
tokens). Tasks:

- "step_pipeline": bench/step_pipeline.py's task (the agent answers "no" to every
  "yes" question; proposals per instance, aggregation into 2 candidates, validation on
  the batch); 32 examples, batches of 8, 2 epochs, 16 test examples.
- "learns": the agent answers right once its prompt says "yes"; opto's defaults
  (reflective proposals, a held-out split raced after the batch); 64 examples, batches
  of 4: a run whose steps stop failing once it has learned, which the estimate does not
  foresee.

Reported per task: calls, tokens and dollars, estimated and spent, and their ratio; then
the calls' range (at the fewest, if nothing is accepted, at the most) and whether the
calls spent fall in it.

    python bench/estimate.py
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from step_pipeline import QuestionAgent  # noqa: E402
from step_pipeline import reply as pipeline_reply  # noqa: E402

from opto import AggregatedUpdate, Aggregator, ExactMatchGuide, Optimizer  # noqa: E402
from opto.llm import OpenAIModel  # noqa: E402
from opto.testing import FakeOpenAIServer  # noqa: E402

PRICES = {"agent": {"input": 0.15, "output": 0.6}, "optimizer": {"input": 2.5, "output": 10.0},
          "aggregator": {"input": 2.5, "output": 10.0}}  # fmt: skip


def learning_reply(body: dict[str, Any]) -> list[str]:
    n = body.get("n") or 1
    if body["model"] == "agent":
        return ["yes" if "yes" in body["messages"][0]["content"].lower() else "no"] * n
    suggestion = {"system_prompt": "Answer yes."}
    return [json.dumps({"reasoning": "they all expect yes", "suggestion": suggestion})] * n


def questions(n: int, prefix: str) -> list[dict[str, str]]:
    return [{"x": f"Is item-{i:04d} on the list?", "info": "yes", "id": f"{prefix}{i}"} for i in range(n)]


TASKS: dict[str, dict[str, Any]] = {
    "step_pipeline": {
        "reply": pipeline_reply,
        "trainer": {"proposals": "per_instance", "validation": "minibatch"},
        "aggregator": True,
        "data": 32,
        "train": {"batch_size": 8, "num_epochs": 2},
    },
    "learns": {"reply": learning_reply, "trainer": {}, "aggregator": False, "data": 64, "train": {"batch_size": 4}},
}


def run(task: dict[str, Any]) -> tuple[Any, dict[str, float]]:
    with FakeOpenAIServer(task["reply"]) as server:
        llms = {n: OpenAIModel(n, base_url=server.base_url, api_key="bench", prices=PRICES) for n in PRICES}

        def trainer() -> AggregatedUpdate:
            aggregator = Aggregator(llms["aggregator"], num_candidates=2) if task["aggregator"] else None
            return AggregatedUpdate(QuestionAgent(llms["agent"]), Optimizer(llms["optimizer"]), aggregator=aggregator,
                                    **task["trainer"])  # fmt: skip

        options = {**task["train"], "test_dataset": questions(16, "t"), "progress": False}
        data = questions(task["data"], "q")
        estimate = trainer().estimate(ExactMatchGuide(), data, **options)
        before = {n: m.usage for n, m in llms.items()}
        trainer().train(ExactMatchGuide(), data, **options)
        spent = {
            "calls": sum(m.usage.calls - before[n].calls for n, m in llms.items()),
            "tokens": sum(m.usage.total_tokens - before[n].total_tokens for n, m in llms.items()),
            "usd": sum(m.usage.cost_usd - before[n].cost_usd for n, m in llms.items()),
        }
        for model in llms.values():
            model.close()
    return estimate, spent


def main() -> None:
    print(f"Python {platform.python_version()}, load {os.getloadavg()[0]:.2f}\n")
    print("| task | what | estimated | spent | estimated / spent |")
    print("|---|---|---:|---:|---:|")
    for name, task in TASKS.items():
        estimate, spent = run(task)
        figures = {"calls": estimate.calls, "tokens": estimate.prompt_tokens + estimate.completion_tokens,
                   "usd": estimate.usd or 0.0}  # fmt: skip
        for what in ("calls", "tokens", "usd"):
            shown = (lambda v: f"${v:.4f}") if what == "usd" else (lambda v: f"{v:,.0f}")
            print(f"| {name} | {what} | {shown(figures[what])} | {shown(spent[what])} | "
                  f"{figures[what] / spent[what]:.2f} |")  # fmt: skip
        ranged = (estimate.calls_at_fewest, estimate.calls_if_nothing_accepted, estimate.calls_at_most)
        inside = "yes" if ranged[0] <= spent["calls"] <= ranged[2] else "**no**"
        print(f"| {name} | calls: fewest / nothing accepted / most | {' / '.join(f'{n:,}' for n in ranged)} | "
              f"{spent['calls']:,.0f} | in the range: {inside} |")  # fmt: skip
        notes = [a for a in estimate.assumptions if re.match("validation", a)]
        print(f"| {name} | measuring cost | {estimate.spent.calls} calls | | |", file=sys.stderr)
        print(f"{name}: {notes[0] if notes else ''}", file=sys.stderr)


if __name__ == "__main__":
    main()
