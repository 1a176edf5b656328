"""Observing a run: `Callback` hooks, called by the training loop.

Callbacks are observers: they receive the run's events and records and cannot change
the run. A callback that raises is logged and detached; the run goes on. The run
directory's writer (`opto.run.ledger.RunDirWriter`) is itself a callback, fed the same way.
Tracking integrations live above this module, in `opto.report.tracking` (MLflow); nothing that
this module's importers need may import back into it.

Any tracker can be plugged in with a few lines, e.g. Weights & Biases::

    class WandbCallback(opto.Callback):
        def on_step_end(self, record):
            wandb.log({"score": record.score, "accepted": record.accepted}, step=record.step)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..errors import OptoTypeError

if TYPE_CHECKING:
    from .events import LedgerEvent, StepRecord
    from .results import EvalResult, TrainResult

__all__ = ["Callback", "CallbackList", "deliver_step"]

logger = logging.getLogger(__name__)


class Callback:
    """Base class: override the hooks you need; each default does nothing."""

    def on_train_start(self, trainer: Any, config: dict[str, Any]) -> None:
        """Before the first step (also on resume); `config` holds the train() settings."""

    def on_event(self, event: LedgerEvent) -> None:
        """Every ledger event, in the order it happened (delivered when its step ends)."""

    def on_step_end(self, record: StepRecord) -> None:
        """Once per finished step, after its events."""

    def on_evaluate_end(self, step: int, result: EvalResult) -> None:
        """After each evaluation of the test dataset (`step` 0 is before training)."""

    def on_train_end(self, result: TrainResult) -> None:
        """Once, when train() returns (finished, stopped or resumed-and-finished)."""


class CallbackList:
    """Calls every callback in turn; one that raises is logged and detached."""

    def __init__(self, callbacks: Iterable[Callback] = ()) -> None:
        self.callbacks = list(callbacks)
        for callback in self.callbacks:
            if not isinstance(callback, Callback):
                raise OptoTypeError(f"callbacks must be opto.Callback instances, got {type(callback).__name__}")

    def call(self, hook: str, *args: Any) -> None:
        for callback in list(self.callbacks):
            try:
                getattr(callback, hook)(*args)
            except Exception:  # an observer must never stop the run
                logger.exception(
                    "callback %s raised in %s; it is detached for the rest of the run", type(callback).__name__, hook
                )
                self.callbacks.remove(callback)

    def on_event(self, event: LedgerEvent) -> None:
        self.call("on_event", event)

    def on_step_end(self, record: StepRecord) -> None:
        self.call("on_step_end", record)


def deliver_step(sink: Callback | CallbackList, record: StepRecord) -> None:
    """A finished step to a sink: `on_event` for each of its events in order, then `on_step_end`."""
    for event in record.events:
        sink.on_event(event)
    sink.on_step_end(record)
