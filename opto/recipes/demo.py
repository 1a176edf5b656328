"""The `opto demo` job: a few-shot agent learns its demos on BIG-bench English plurals.

Runs offline on the bundled SmolLM2-135M-Instruct (agent, optimizer and aggregator), or
on any OpenAI-compatible server. The agent has two parameters, a system prompt and a
`Demos` list; the trainer asks two proposers per training instance, the LLM `Optimizer`
(the prompt) and `DemoProposer` (the demos), validates every candidate on a validation
split and keeps what scores better. Test accuracy is measured on a held-out split
before and after, beside the best constant answer on that split, so a gain that a
constant answer could match is never mistaken for learning.

Why this task: SmolLM2-135M ignores format instructions (zero-shot it writes a sentence
and scores 0%), but it knows English plurals and follows demonstrations. The task's
best constant answer scores about 3%: what the demos unlock is skill, not a format that
a constant answer could fake (see BENCHMARKS.md for the tasks measured before choosing).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ..core.agent import Agent
from ..core.data import Example
from ..core.guides import ExactMatchGuide
from ..core.parameters import Constraint, Demos, Parameter
from ..core.stats import paired_change
from ..datasets import bigbench
from ..llm.base import Model
from ..run.ledger import RunDir
from ..run.results import FinalCheckResult
from ..search.aggregation import Aggregator
from ..search.proposers import DemoProposer, Optimizer
from ..search.validation import DatasetValidation
from ..trainer import AggregatedUpdate
from ..trainer.estimate import Estimate

__all__ = ["DemoReport", "FewShotAgent", "demo_trainer", "first_line", "majority_baseline", "run_demo"]

DEMO_TASK = "plural"


def first_line(text: str) -> str:
    """The reply's first non-empty line, stripped (a model often adds an explanation)."""
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


def majority_baseline(examples: list[Example]) -> float:
    """Accuracy of the best constant answer: the most frequent first accepted answer."""
    counts = collections.Counter(str(e.info[0] if isinstance(e.info, list) else e.info) for e in examples)
    return counts.most_common(1)[0][1] / len(examples) if examples else 0.0


class FewShotAgent(Agent):
    """Answers with one model call: system prompt, demos as earlier turns, the question.

    Both the system prompt and the demos are trainable; the answer is the reply's first line.
    With `logprobs=True` each call records its tokens' log-probabilities (what makes the
    groups of a collection on-policy for GRPO exports).
    """

    def __init__(
        self,
        model: Model,
        prompt: str = "Answer the question.",
        max_demos: int = 4,
        max_tokens: int = 12,
        logprobs: bool = False,
    ) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self.logprobs = logprobs
        self.system_prompt = Parameter(
            prompt,
            description="The system prompt of a model that answers with the answer only, nothing else.",
            constraint=Constraint("plain instructions, at most 400 characters", max_length=400),
        )
        self.demos = Demos(max_demos=max_demos)

    def messages(self, question: str, *, demos: bool = True) -> list[dict[str, str]]:
        """The chat the model is asked: system prompt, the demos as earlier turns (unless
        `demos=False`: the zero-shot prompt a distilled model is trained and asked on), question."""
        shown = self.demos.as_messages() if demos else []
        return [{"role": "system", "content": self.system_prompt.value}, *shown, {"role": "user", "content": question}]

    async def forward(self, question: str) -> str:
        reply = await self.model.complete(
            self.messages(question),
            temperature=0.0,
            max_tokens=self.max_tokens,
            seed=0,
            logprobs=self.logprobs,
        )
        return first_line(reply.text)


class DemoReport(BaseModel):
    """The figures `opto demo` prints (`opto demo --json` prints this object)."""

    model: str
    task: str
    seed: int
    test_before: float | None
    test_after: float | None
    test_baseline: float
    test_examples: int
    steps: int
    accepted: int
    rejected: int
    calls: int
    cached_calls: int
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    run_dir: str
    initial_parameters: dict[str, Any]
    final_parameters: dict[str, Any]
    stopped_reason: str | None = None
    # 95% intervals (Wilson's) of the test scores, and the paired change with its interval.
    test_before_interval: tuple[float, float] | None = None
    test_after_interval: tuple[float, float] | None = None
    test_change: float | None = None
    test_change_interval: tuple[float, float] | None = None
    # Test examples whose rollout failed (scored 0), before and after; why nothing was accepted.
    test_before_failed: int | None = None
    test_after_failed: int | None = None
    diagnosis: str | None = None
    # How the returned values were checked against the start (`TrainResult.final_check`).
    final_check: FinalCheckResult | None = None


def _test_change(run: RunDir) -> dict[str, Any]:
    """The paired change between the first and the final test evaluation, with its interval
    (the per-example scores are in eval.jsonl; each score's own interval is in `TrainResult`)."""
    rows = run.evaluations()
    first = {r["example_id"]: r.get("score") for r in rows if r.get("step") == 0 and not r.get("final")}
    final = {r["example_id"]: r.get("score") for r in rows if r.get("final")}
    change = paired_change(list(first.values()), [final.get(k) for k in first])
    if change is None:
        return {}
    return {"test_change": change.difference, "test_change_interval": (change.interval.low, change.interval.high)}


def demo_trainer(
    agent: FewShotAgent,
    model: Model,
    *,
    task: str = DEMO_TASK,
    validation_n: int = 24,
    seed: int = 0,
    selection: str = "greedy",
) -> AggregatedUpdate:
    """The demo's trainer: `model` proposes the prompt (`Optimizer`) and merges the
    proposals, `DemoProposer` picks demos from the labels, the task's validation split
    decides acceptance."""
    return AggregatedUpdate(
        agent,
        [Optimizer(model, max_tokens=120, temperature=0.8), DemoProposer(source="labels")],
        aggregator=Aggregator(model, max_tokens=160, temperature=0.8),
        concurrency=4,
        # Every candidate on the whole validation split (no screening on the batch): the
        # run's ledger then holds each example's rollouts under several candidates, which
        # `opto export --format art` makes into groups (the RL walkthrough).
        validation=DatasetValidation(bigbench(task, split="validation", n=validation_n, seed=seed)),
        selection=selection,
    )


def run_demo(
    model: Model,
    *,
    run_dir: str | Path,
    task: str = DEMO_TASK,
    train_n: int = 12,
    validation_n: int = 24,
    test_n: int = 64,
    batch_size: int = 4,
    num_epochs: int = 1,
    seed: int = 0,
    selection: str = "greedy",
    progress: bool = True,
    resume: bool = False,
    confirm: bool | Callable[[Estimate], bool] = False,
) -> DemoReport:
    """Train the few-shot agent's prompt and demos with `model` as agent, optimizer and aggregator.

    The task's train split gives the training examples (and so the demos), its
    validation split decides acceptance, its test split is only measured. `resume`
    continues an interrupted demo in `run_dir` (the same arguments are needed);
    `confirm` is `train()`'s (the cost estimate, asked before the run starts).
    """
    started = time.monotonic()
    agent = FewShotAgent(model)
    initial = agent.parameter_values()
    test = bigbench(task, split="test", n=test_n, seed=seed)
    trainer = demo_trainer(agent, model, task=task, validation_n=validation_n, seed=seed, selection=selection)
    result = trainer.train(
        ExactMatchGuide(),
        bigbench(task, split="train", n=train_n, seed=seed),
        test_dataset=test,
        batch_size=batch_size,
        num_epochs=num_epochs,
        eval_frequency=None,
        run_dir=run_dir,
        seed=seed,
        progress=progress,
        resume=resume,
        confirm=confirm,
    )
    usage = result.usage
    return DemoReport(
        **_test_change(RunDir(run_dir)),
        test_before_interval=result.initial_test_interval,
        test_after_interval=result.final_test_interval,
        model=model.name,
        task=task,
        seed=seed,
        test_before=result.initial_test_score,
        test_after=result.final_test_score,
        test_baseline=majority_baseline(test),
        test_examples=len(test),
        steps=result.steps,
        accepted=result.accepted,
        rejected=result.rejected,
        calls=usage.calls,
        cached_calls=usage.cached_calls,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        seconds=round(time.monotonic() - started, 1),
        run_dir=str(run_dir),
        initial_parameters=initial,
        final_parameters=result.final_parameters,
        stopped_reason=result.stopped_reason,
        test_before_failed=result.initial_test_failed,
        test_after_failed=result.final_test_failed,
        diagnosis=result.diagnosis,
        final_check=result.final_check,
    )
