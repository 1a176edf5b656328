"""Evaluating an agent on a dataset."""

from __future__ import annotations

from typing import Any

from tqdm.auto import tqdm

from .._util.async_tools import run_sync
from ..core.agent import Agent
from ..core.data import load_dataset
from ..core.guides import Guide
from ..core.parameters import ParameterValues
from ..core.rollout import Rollout
from ..executors.local import AsyncioExecutor, RolloutExecutor
from ..run.results import EvalResult
from .failures import DEFAULT_MAX_FAILURES, FailureLog, check_failures, validate_max_failures

__all__ = ["aevaluate", "evaluate"]


async def aevaluate(
    agent: Agent,
    guide: Guide,
    dataset: Any,
    *,
    concurrency: int = 16,
    values: ParameterValues | None = None,
    min_score: float | None = 0.0,
    max_failures: int | float | None = DEFAULT_MAX_FAILURES,
    rollout_timeout: float | None = None,
    failure_log: FailureLog | None = None,
    executor: RolloutExecutor | None = None,
    progress: bool = False,
) -> EvalResult:
    """Run and judge `agent` on every example of `dataset`, `concurrency` at a time (or
    through `executor`).

    A rollout whose agent or guide raised, or that ran longer than `rollout_timeout`
    seconds, counts as failed: it scores `min_score` (0.0 by default; None leaves it out
    of `mean`) and is counted in `n_failed`. The first failure of
    each kind is logged at WARNING. Raises `TooManyFailures` when the failed examples
    reach `max_failures` (an int counts them, a float is a fraction of the dataset; the
    default 1.0 raises only when every example failed; None never raises). `progress`
    shows a bar of examples done with their running mean.
    """
    validate_max_failures(max_failures)
    examples = load_dataset(dataset)
    runner = executor or AsyncioExecutor(concurrency)
    with tqdm(total=len(examples), disable=not progress, desc="evaluation", unit="example", leave=False) as bar:
        total, judged = 0.0, 0

        def done(rollout: Rollout) -> None:
            nonlocal total, judged
            if rollout.score is not None:
                total, judged = total + rollout.score, judged + 1
            bar.update(1)
            if judged:
                bar.set_postfix(mean=f"{total / judged:.3f}")

        rollouts = await runner.run(
            agent,
            guide,
            examples,
            values=values,
            min_score=min_score,
            timeout=rollout_timeout,
            on_result=done if progress else None,  # nothing to show: no work per rollout
        )
    (failure_log or FailureLog()).note(rollouts, "evaluation")
    check_failures(rollouts, max_failures, "the evaluation")
    return EvalResult.from_rollouts(rollouts)


def evaluate(
    agent: Agent,
    guide: Guide,
    dataset: Any,
    *,
    concurrency: int = 16,
    values: ParameterValues | None = None,
    min_score: float | None = 0.0,
    max_failures: int | float | None = DEFAULT_MAX_FAILURES,
    rollout_timeout: float | None = None,
    executor: RolloutExecutor | None = None,
    progress: bool = False,
) -> EvalResult:
    """Synchronous `aevaluate` (also works inside a running event loop); the arguments are its."""
    return run_sync(
        aevaluate(
            agent,
            guide,
            dataset,
            concurrency=concurrency,
            values=values,
            min_score=min_score,
            max_failures=max_failures,
            rollout_timeout=rollout_timeout,
            executor=executor,
            progress=progress,
        )
    )
