"""The `opto demo` job: optimize a QA agent's system prompt on BIG-bench object counting.

Runs offline on the bundled SmolLM2-135M-Instruct (agent, optimizer and aggregator),
or on any OpenAI-compatible server. A 135M model is weak: the point is to show the
whole loop run for real (proposals, aggregation, validation, ledger), not a big gain.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from .agent import Agent
from .datasets import bigbench
from .guides import ExactMatchGuide
from .llm.base import Model
from .optimizers import Optimizer
from .parameters import Constraint, Parameter
from .aggregation import Aggregator
from .trainer import AggregatedUpdate
from .trainer.validation import DatasetValidation

__all__ = ["CountingAgent", "DemoReport", "run_demo"]

_NUMBER_WORDS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen " \
    "sixteen seventeen eighteen nineteen twenty".split()


def first_number(text: str) -> str:
    """The first number in a reply, as digits ("seven" -> "7"); the stripped text if none."""
    match = re.search(r"\b(\d+|" + "|".join(_NUMBER_WORDS) + r")\b", text.lower())
    if match is None:
        return text.strip()
    token = match.group(1)
    return token if token.isdigit() else str(_NUMBER_WORDS.index(token))


class CountingAgent(Agent):
    """Asks its model to count the objects in a question; the system prompt is trainable."""

    def __init__(self, model: Model, prompt: str = "Answer the question.") -> None:
        self.model = model
        self.system_prompt = Parameter(
            prompt,
            description="The system prompt of a model that answers counting questions with one number.",
            constraint=Constraint("plain instructions, at most 600 characters", max_length=600),
        )

    async def forward(self, question: str) -> str:
        reply = await self.model.complete(
            [{"role": "system", "content": self.system_prompt.value}, {"role": "user", "content": question}],
            temperature=0.0,
            max_tokens=32,
            seed=0,
        )
        return first_number(reply.text)


class DemoReport(BaseModel):
    """The figures `opto demo` prints."""

    model: str
    test_before: float | None
    test_after: float | None
    steps: int
    accepted: int
    rejected: int
    calls: int
    cached_calls: int
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    run_dir: str
    initial_prompt: str
    final_prompt: str


def run_demo(
    model: Model,
    *,
    run_dir: str | Path,
    train_n: int = 8,
    validation_n: int = 8,
    test_n: int = 24,
    batch_size: int = 4,
    num_epochs: int = 1,
    seed: int = 0,
    progress: bool = True,
) -> DemoReport:
    """Train the counting agent's prompt with `model` as agent, optimizer and aggregator."""
    started = time.monotonic()
    agent = CountingAgent(model)
    initial_prompt = agent.system_prompt.value
    trainer = AggregatedUpdate(
        agent,
        Optimizer(model, max_tokens=160, temperature=0.8),
        aggregator=Aggregator(model, max_tokens=200, temperature=0.8),
        concurrency=4,
        validation=DatasetValidation(bigbench("object_counting", split="validation", n=validation_n, seed=seed)),
    )
    result = trainer.train(
        ExactMatchGuide(),
        bigbench("object_counting", split="train", n=train_n, seed=seed),
        test_dataset=bigbench("object_counting", split="test", n=test_n, seed=seed),
        batch_size=batch_size,
        num_epochs=num_epochs,
        eval_frequency=None,
        run_dir=run_dir,
        seed=seed,
        progress=progress,
    )
    usage = result.usage
    return DemoReport(
        model=model.name,
        test_before=result.initial_test_score,
        test_after=result.final_test_score,
        steps=result.steps,
        accepted=result.accepted,
        rejected=result.rejected,
        calls=usage.calls,
        cached_calls=usage.cached_calls,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        seconds=round(time.monotonic() - started, 1),
        run_dir=str(run_dir),
        initial_prompt=initial_prompt,
        final_prompt=agent.system_prompt.stored_value,
    )
