"""The shared world of the tests: small agents, scripted "brains" and runs.

Two worlds are used across modules:

- the *level* world: an agent whose model answers `2x` for input `x` only when its
  system prompt says "level N" with `x < N`; one scripted "brain" model plays the
  optimizer and the aggregator, telling which by the system message, and raises the
  level by `delta`, so whether a candidate helps depends on the batch;
- the *counting* world (`make_run`): a counting agent trained with two proposals per
  instance, each scored on its own, for the preference and fine-tuning tests.

Fixtures built on them are in `conftest.py`.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

from opto.run.ledger import RunDir
from opto import Agent, AggregatedUpdate, Aggregator, ExactMatchGuide, Optimizer, Parameter, ScriptedModel

# ------------------------------------------------------------------------------ level world

OPTIMIZER_SYSTEM = "You improve the parameters"
AGGREGATOR_SYSTEM = "You merge several suggested updates"


def agent_reply(messages):
    level = int(re.fullmatch(r"level (-?\d+)", messages[0]["content"]).group(1))
    x = int(messages[1]["content"])
    return str(2 * x) if x < level else "wrong"


class LevelAgent(Agent):
    def __init__(self, model, level=0, fail_on=()):
        self.model = model
        self.system_prompt = Parameter(f"level {level}", description="the agent's system prompt")
        self.fail_on = set(fail_on)

    async def forward(self, x):
        if x in self.fail_on:
            raise RuntimeError(f"agent cannot handle {x}")
        reply = await self.model.complete(
            [{"role": "system", "content": self.system_prompt.value}, {"role": "user", "content": str(x)}]
        )
        return reply.text


def role_of(messages):
    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    if system.startswith(OPTIMIZER_SYSTEM):
        return "optimizer"
    if system.startswith(AGGREGATOR_SYSTEM):
        return "aggregator"
    raise AssertionError(f"unexpected prompt: {messages[0]}")


def make_brain(delta=1, optimizer=None, aggregator=None):
    """A callable for ScriptedModel; `optimizer`/`aggregator` override that role's reply."""

    def respond(messages):
        role = role_of(messages)
        text = messages[-1]["content"]
        if role == "optimizer":
            if optimizer is not None:
                return optimizer(messages)
            level = int(re.search(r'- current value: "level (-?\d+)"', text).group(1))
            return json.dumps({"reasoning": "raise the level", "suggestion": {"system_prompt": f"level {level + delta}"}})
        if aggregator is not None:
            return aggregator(messages)
        level = int(re.search(r'"system_prompt": "level (-?\d+)"', messages[1]["content"]).group(1))
        return json.dumps({"reasoning_system_prompt": "one step",
                           "suggestion": {"system_prompt": f"level {level + delta}"}})

    return respond


def requests_of(model, role):
    return [r for r in model.requests if role_of(r["messages"]) == role]


def dataset(xs):
    return [{"x": x, "info": str(2 * x), "id": f"x{x}"} for x in xs]


def make_level_trainer(level=0, delta=1, brain_kwargs=None, agent_kwargs=None, brain_model_kwargs=None,
                 agent_model_kwargs=None, **trainer_kwargs):
    agent_model = ScriptedModel(agent_reply, name="agent-model", **(agent_model_kwargs or {}))
    brain = ScriptedModel(make_brain(delta, **(brain_kwargs or {})), name="brain", **(brain_model_kwargs or {}))
    the_agent = LevelAgent(agent_model, level=level, **(agent_kwargs or {}))
    # The level world's tests are about per-instance proposals accepted on the batch, and
    # the values the search ends with (the final check has tests of its own).
    settings = {"proposals": "per_instance", "validation": "minibatch", "final_check": None, **trainer_kwargs}
    trainer = AggregatedUpdate(the_agent, Optimizer(brain), llm=brain, **settings)
    return trainer, the_agent, agent_model, brain


# --------------------------------------------------------------------------- counting world

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
GOOD = "Count the items. Reply with digits only."
BAD = "Count the items and reply in words."


class Counter(Agent):
    """Counts the words after 'Count:'; answers in digits only when its prompt says so."""

    def __init__(self, model: ScriptedModel) -> None:
        self.model = model
        self.prompt = Parameter("Count the items.", description="the system prompt of the counting model")

    async def forward(self, question: str) -> str:
        reply = await self.model.complete(
            [{"role": "system", "content": self.prompt.value}, {"role": "user", "content": question}]
        )
        return reply.text


def counting_reply(messages: list[dict[str, Any]]) -> str:
    count = len(messages[-1]["content"].split(":", 1)[1].split())
    return str(count) if "digits" in messages[0]["content"] else f"{WORDS[count]} items"


def alternating(first: str, second: str) -> Any:
    """Sample 0 proposes `first`, sample 1 `second` (n=2 samples are drawn in order)."""
    tick = itertools.count()

    def reply(messages: list[dict[str, Any]]) -> str:
        value = first if next(tick) % 2 == 0 else second
        return json.dumps({"reasoning": f"try {value!r}", "suggestion": {"prompt": value}})

    return reply


def make_run(run_dir: Path, *, examples: int = 8, score_proposals: str = "instance") -> dict[str, Any]:
    """Train the counting agent for examples/2 steps into `run_dir`; returns the TrainResult as a dict."""
    data = [{"x": f"Count: {' '.join(['apple'] * k)}", "info": str(k), "id": f"q{k}"} for k in range(1, examples + 1)]
    agent = Counter(ScriptedModel(counting_reply, name="agent-model"))
    trainer = AggregatedUpdate(
        agent,
        Optimizer(ScriptedModel(alternating(GOOD, BAD), name="optimizer-model"), num_proposals=2),
        aggregator=Aggregator(ScriptedModel(alternating(GOOD, "Count the items, explain in words."),
                                            name="aggregator-model"), num_candidates=2),
        score_proposals=score_proposals,
        concurrency=4,
        proposals="per_instance",
        validation="minibatch",
        final_check=None,
    )
    result = trainer.train(ExactMatchGuide(), data, batch_size=2, run_dir=run_dir, progress=False, shuffle=False)
    return result.model_dump()


# ----------------------------------------------------------------------------- comparing runs


def ledger_of(run_dir: Path) -> list[tuple[Any, ...]]:
    """The ledger without ids and times (which differ between any two runs)."""
    return [(r["step"], r["type"], r.get("instance_id"), r.get("phase"), r.get("output"), r.get("score"),
             r.get("error"), r.get("accepted"), json.dumps(r.get("update"), sort_keys=True),
             json.dumps(r.get("trace"), sort_keys=True))
            for r in RunDir(run_dir).ledger()]


def search_records(ledger: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """`ledger_of` less what a run stopped early and resumed pays for again outside the
    search: the final check of the stop and the current values' measurements on the
    validation set (measured again after resume). Both are on the record; an
    uninterrupted run makes only its last check and its first measurements."""
    last = max((record[0] for record in ledger), default=0)
    return [record for record in ledger
            if not (record[3] == "final_check" and record[0] < last) and record[3] != "current"]


def timeless(rollouts: list[Any]) -> list[dict[str, Any]]:
    """Rollouts as ledger records without their wall time (which differs between any two runs)."""
    return [{k: v for k, v in r.to_record().items() if k != "seconds"} for r in rollouts]
