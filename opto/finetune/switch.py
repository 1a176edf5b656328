"""`switch_model`: point an agent at the model a fine-tuning job made.

The switch itself, and its record in the run directory's ``models.json`` that a resumed
run re-applies, are `opto.run.switches`; this adds what a job's result means.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..core.agent import Agent
from ..errors import OptoTypeError
from ..llm.base import Model
from ..run.switches import switch_to
from .base import FineTuneError, TrainingJobStatus

__all__ = ["switch_model"]


def switch_model(
    agent: Agent,
    result: TrainingJobStatus | str | Path,
    *,
    attributes: Iterable[str] | None = None,
    run_dir: str | Path | None = None,
    **options: Any,
) -> Model:
    """Make `agent` use the fine-tuned model of `result`, and return that model.

    Args:
        agent: the agent whose models to switch.
        result: a succeeded job's `TrainingJobStatus` (from `wait_until_complete`), or
            directly a model name or a local model folder.
        attributes: the attribute paths of the models to switch (as `agent.parameters`
            names them: ``"model"``, ``"tools.0.llm"``); default every model the agent
            holds. Models outside the agent (an optimizer's) are never touched.
        run_dir: record the switch in this run directory's ``models.json``, so a run
            resumed there uses the tuned model.
        options: for a local folder, `TransformersModel` options (`max_batch_size`,
            `device`, `dtype` as a name, ...); refused for a model name.

    Raises `FineTuneError` for a job that did not succeed, `ValueError` for an attribute
    that holds no model, or an agent that holds none.
    """
    job_id: str | None = None
    if isinstance(result, TrainingJobStatus):
        if not result.succeeded or not result.fine_tuned_model:
            raise FineTuneError(
                f"job {result.job_id} is {result.status}, with no fine-tuned model to switch to"
                + (f": {result.message}" if result.message else "")
            )
        job_id, result = result.job_id, result.fine_tuned_model
    elif not isinstance(result, (str, os.PathLike)):
        raise OptoTypeError(
            f"switch_model takes a TrainingJobStatus, a model name or a model folder, not {type(result).__name__}"
        )
    return switch_to(agent, str(result), attributes=attributes, run_dir=run_dir, job_id=job_id, **options)
