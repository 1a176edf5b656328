"""What a worker process does with one rollout task: load the shipped agent, run, report.

The same code runs in a Ray task, a Ray actor and the in-process fake cluster of the
tests. The result is plain data: the rollout's fields, the usage of the model calls
made (the driver counts them in the run's meters) and the log records at WARNING and
above (the driver logs them again, so they reach the run's log).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..core.data import Example
from ..core.rollout import run_rollout
from ..llm.errors import BudgetExceeded
from ..llm.sampling import Sampling, sampling
from ..llm.usage import budget_scope, meter_usage

__all__ = ["RolloutTask", "aexecute", "execute", "unload_all"]

_LOADED: OrderedDict[str, tuple[Any, Any, Any]] = OrderedDict()  # digest -> (agent, guide, budgets), newest last
_KEEP_LOADED = 4
_LOADED_LOCK = threading.Lock()


@dataclass
class RolloutTask:
    """One rollout to run where the shipment with `digest` is (or gets) loaded."""

    digest: str
    example: Example
    values: dict[str, Any] = field(default_factory=dict)
    min_score: float | None = None
    timeout: float | None = None
    sampling: Sampling | None = None


def _load(digest: str, blob: bytes) -> tuple[Any, Any, Any]:
    """The agent, guide and run budgets of a shipment, unpickled once per process and kept for the next tasks."""
    with _LOADED_LOCK:
        if digest in _LOADED:
            _LOADED.move_to_end(digest)
            return _LOADED[digest]
    import cloudpickle

    loaded = cloudpickle.loads(blob)
    with _LOADED_LOCK:
        _LOADED[digest] = loaded
        while len(_LOADED) > _KEEP_LOADED:
            _LOADED.popitem(last=False)
    return loaded


_RECORDS: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar("opto_worker_logs", default=None)


def unload_all() -> None:
    """Forget the agents this process loaded (their models close when collected)."""
    import gc

    with _LOADED_LOCK:
        _LOADED.clear()
    gc.collect()


class _Collect(logging.Handler):
    """Keeps each rollout's WARNING+ records (its task, and threads it starts) for the driver."""

    def emit(self, record: logging.LogRecord) -> None:
        records = _RECORDS.get()
        if records is not None:
            records.append({"name": record.name, "level": record.levelno, "message": record.getMessage()})


_HANDLER = _Collect(logging.WARNING)


async def aexecute(blob: bytes, task: RolloutTask) -> dict[str, Any]:
    """Run one task; `blob` is the pickled shipment, unpickled only when this process has
    not loaded it yet."""
    agent, guide, budgets = _load(task.digest, blob)
    root = logging.getLogger()
    if _HANDLER not in root.handlers:
        root.addHandler(_HANDLER)
    records: list[dict[str, Any]] = []
    token = _RECORDS.set(records)
    result: dict[str, Any] = {"pid": os.getpid()}
    try:
        with meter_usage() as meter, budget_scope(*budgets):
            try:
                if task.sampling is not None:
                    with sampling(temperature=task.sampling.temperature, seed=task.sampling.seed):
                        rollout = await run_rollout(
                            agent,
                            guide,
                            task.example,
                            values=task.values,
                            min_score=task.min_score,
                            timeout=task.timeout,
                        )
                else:
                    rollout = await run_rollout(
                        agent, guide, task.example, values=task.values, min_score=task.min_score, timeout=task.timeout
                    )
                result["rollout"] = {**rollout.model_dump(mode="json"), "parameters_read": rollout.parameters_read}
            except BudgetExceeded as exc:
                result["budget_exceeded"] = str(exc)
        result["usage"] = {name: stats.model_dump() for name, stats in meter.by_model.items()}
    finally:
        _RECORDS.reset(token)
    result["logs"] = records
    return result


def execute(blob: bytes, task: RolloutTask) -> dict[str, Any]:
    """`aexecute` from sync code (a Ray task, a thread)."""
    return asyncio.run(aexecute(blob, task))
