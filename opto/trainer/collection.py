"""`opto.collect`: gather RL data with the current parameters, optimizing nothing.

The agent runs `samples` times on every example (through any `RolloutExecutor`: in this
process, or on Ray), each sample inside
`opto.llm.sampling(temperature=..., seed=seed + k)`, so its model calls draw different
replies even when the agent fixes its own temperature. Each rollout is judged by the guide
and written to the run directory's ledger as a `RolloutEvent` (phase "collect", step 1,
`sample` k), one example's samples in one append. `opto export RUN --format art` then
reads one trajectory group per example.

Resumable like a training run: `resume=True` skips the examples whose samples are all
written (a torn or partial example is dropped and done again); the settings must match.
A `BudgetExceeded` stops the collection cleanly with what was written kept.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from tqdm.auto import tqdm

from .._util.async_tools import gather_all, run_sync
from .._util.files import atomic_write_json, atomic_write_jsonl, read_jsonl, repair_jsonl
from ..core.agent import Agent
from ..core.data import Example, load_dataset
from ..core.guides import Guide
from ..core.rollout import Rollout, mean_score
from ..errors import OptoTypeError, OptoValueError
from ..executors.local import AsyncioExecutor, RolloutExecutor
from ..llm.errors import BudgetExceeded
from ..llm.sampling import sampling
from ..llm.usage import UsageStats, meter_usage
from ..run.events import RolloutEvent
from ..run.ledger import RunDir

__all__ = ["CollectResult", "acollect", "collect"]

logger = logging.getLogger(__name__)

COLLECT_STEP = 1
_SETTINGS = "collect.json"


class CollectResult(BaseModel):
    """What a `collect` call did."""

    run_dir: str
    examples: int
    samples: int
    rollouts: int = 0
    failed: int = 0
    skipped_examples: int = Field(0, description="examples already collected by an earlier call (resume)")
    mean_score: float | None = None
    usage: UsageStats = Field(default_factory=UsageStats)
    stopped_reason: str | None = None
    seconds: float = 0.0


def collect(agent: Agent, guide: Guide, dataset: Any, **kwargs: Any) -> CollectResult:
    """Synchronous `acollect`; also works inside a running event loop (Jupyter)."""
    return run_sync(acollect(agent, guide, dataset, **kwargs))


async def acollect(
    agent: Agent,
    guide: Guide,
    dataset: Any,
    *,
    samples: int = 4,
    run_dir: str | Path,
    temperature: float = 1.0,
    seed: int = 0,
    resume: bool = False,
    concurrency: int = 16,
    min_score: float | None = None,
    rollout_timeout: float | None = None,
    progress: bool = True,
    executor: RolloutExecutor | None = None,
) -> CollectResult:
    """Run `agent` `samples` times on every example of `dataset` and write the judged
    rollouts to `run_dir`'s ledger (see the module's docstring).

    Args:
        samples: rollouts per example (a GRPO group's size); at least 2.
        temperature: the sampling temperature of every model call of the agent.
        seed: sample k of every example is drawn with seed `seed + k`.
        resume: continue a collection in `run_dir` (same settings) instead of refusing it.
        concurrency: rollouts in flight at once, wherever they run.
        min_score: a failed rollout's score, as in `train()`.
        rollout_timeout: seconds after which a rollout counts as failed, as in `train()`.
        progress: show a progress bar of examples collected.
        executor: where the rollouts run (default: asyncio tasks in this process), e.g.
            `RayExecutor()`; sample k of every example runs under the same seed wherever it runs.
    """
    if not isinstance(agent, Agent):
        raise OptoTypeError(f"agent must be an opto Agent (subclass it or use @agent), got {type(agent).__name__}")
    if not hasattr(guide, "aget_feedback"):
        raise OptoTypeError(
            f"guide must be an opto Guide with get_feedback(x, output, info), got {type(guide).__name__}"
        )
    if not isinstance(samples, int) or samples < 2:
        raise OptoValueError(f"samples must be an int >= 2 (a group needs rollouts to compare), got {samples!r}")
    if concurrency < 1:
        raise OptoValueError(f"concurrency must be >= 1, got {concurrency}")
    started = time.monotonic()
    examples = load_dataset(dataset)
    run = RunDir(run_dir)
    settings = {
        "samples": samples,
        "temperature": temperature,
        "seed": seed,
        "num_examples": len(examples),
        "values": agent.stored_values(trainable_only=True),
    }
    done = _start(run, settings, resume)
    todo = [e for e in examples if e.id not in done]
    result = CollectResult(
        run_dir=str(run.path), examples=len(examples), samples=samples, skipped_examples=len(examples) - len(todo)
    )
    runner = executor or AsyncioExecutor(1)
    gate = asyncio.Semaphore(concurrency)  # rollouts in flight, wherever they run
    bar = tqdm(
        total=len(examples), initial=result.skipped_examples, disable=not progress, desc="collect", unit="example"
    )
    scores: list[Rollout] = []

    async def sample(example: Example, k: int) -> Rollout:
        async with gate:
            with sampling(temperature=temperature, seed=seed + k):  # travels with the task to a worker
                [rollout] = await runner.run(agent, guide, [example], min_score=min_score, timeout=rollout_timeout)
        return rollout

    async def one_example(example: Example) -> None:
        rollouts = await gather_all(sample(example, k) for k in range(samples))
        run.append_events(
            [
                RolloutEvent(step=COLLECT_STEP, phase="collect", sample=k, **r.to_record())
                for k, r in enumerate(rollouts)
            ]
        )
        result.rollouts += len(rollouts)
        result.failed += sum(r.failed for r in rollouts)
        scores.extend(rollouts)
        bar.update(1)

    with meter_usage() as meter:
        try:
            await gather_all(one_example(e) for e in todo)
        except BudgetExceeded as exc:
            result.stopped_reason = f"budget exceeded: {exc}"
            logger.warning("collection stopped: %s (what was written is kept; resume=True continues)", exc)
        finally:
            bar.close()
    result.usage = sum(meter.by_model.values(), UsageStats())
    result.mean_score = mean_score(scores)
    result.seconds = round(time.monotonic() - started, 3)
    return result


def _start(run: RunDir, settings: dict[str, Any], resume: bool) -> set[str]:
    """The ids of the examples already collected (every sample written); checks the settings."""
    path = run.path / _SETTINGS
    if not path.exists():
        if run.ledger_path.exists():
            raise OptoValueError(
                f"{run.path} already holds a run that opto.collect did not write; choose another run_dir"
            )
        atomic_write_json(path, settings)
        return set()
    if not resume:
        raise OptoValueError(
            f"{run.path} already holds a collection; pass resume=True to continue it, or choose another run_dir"
        )
    saved = _saved_settings(path)
    for key, value in settings.items():
        if saved.get(key) != value:
            raise OptoValueError(
                f"cannot resume the collection in {run.path}: it was started with {key}={saved.get(key)!r}, "
                f"this call has {key}={value!r}"
            )
    repair_jsonl(run.ledger_path)
    records = read_jsonl(run.ledger_path)
    counts: dict[str, int] = {}
    for record in records:
        counts[record.get("instance_id", "")] = counts.get(record.get("instance_id", ""), 0) + 1
    complete = {name for name, count in counts.items() if count == settings["samples"]}
    kept = [r for r in records if r.get("instance_id") in complete]
    if len(kept) != len(records):  # a partial example (should not happen: one append each): redone
        atomic_write_jsonl(run.ledger_path, kept)
    logger.info("resuming the collection in %s: %d examples already collected", run.path, len(complete))
    return complete


def _saved_settings(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise OptoValueError(f"{path} is not a valid opto collection settings file: {exc}") from exc
    if not isinstance(value, dict):
        raise OptoValueError(f"{path} is not a valid opto collection settings file (not a JSON object)")
    return value
