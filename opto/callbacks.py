"""Observing a run: `Callback` hooks, called by the training loop.

Callbacks are observers: they receive the run's events and records and cannot change
the run. A callback that raises is logged and detached; the run goes on. The run
directory's writer (`opto.ledger.RunDirWriter`) is itself a callback, fed the same way.

Any tracker can be plugged in with a few lines, e.g. Weights & Biases::

    class WandbCallback(opto.Callback):
        def on_step_end(self, record):
            wandb.log({"score": record.score, "accepted": record.accepted}, step=record.step)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .events import LedgerEvent, StepRecord
    from .trainer.evaluation import EvalResult
    from .trainer.minibatch import TrainResult

__all__ = ["Callback", "CallbackList", "MLflowCallback", "deliver_step"]

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
                raise TypeError(f"callbacks must be opto.Callback instances, got {type(callback).__name__}")

    def call(self, hook: str, *args: Any) -> None:
        for callback in list(self.callbacks):
            try:
                getattr(callback, hook)(*args)
            except Exception:  # an observer must never stop the run
                logger.exception("callback %s raised in %s; it is detached for the rest of the run",
                                 type(callback).__name__, hook)
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


class MLflowCallback(Callback):
    """Tracks a training run in MLflow (the `mlflow` extra: `pip install -e ".[mlflow]"`).

    Logs the train() settings as parameters, each step's score, decision and candidate
    score and each evaluation's test score as metrics, and at the end the usage, the final
    parameter values (`final_parameters.json`) and, for a run with a run directory, the
    `opto report` picture and summary as artifacts.

    Args:
        tracking_uri: where MLflow keeps runs (None: MLflow's default / `MLFLOW_TRACKING_URI`).
        experiment: the experiment's name (created when missing).
        run_name: the MLflow run's name.
        report: also log `report.png` and `report.md`.
    """

    def __init__(self, tracking_uri: str | None = None, experiment: str = "opto", run_name: str | None = None,
                 report: bool = True) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as exc:
            raise ImportError('MLflowCallback needs MLflow: pip install -e ".[mlflow]" (or mlflow-skinny)') from exc
        self.client = MlflowClient(tracking_uri)
        self.experiment = experiment
        self.run_name = run_name
        self.report = report
        self.run_id: str | None = None

    def on_train_start(self, trainer: Any, config: dict[str, Any]) -> None:
        found = self.client.get_experiment_by_name(self.experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(self.experiment)
        self.run_id = self.client.create_run(experiment_id, run_name=self.run_name).info.run_id
        settings = {**config, "trainer": type(trainer).__name__}
        proposers = getattr(trainer, "proposers", None)
        if proposers:
            settings["proposers"] = ",".join(p.name for p in proposers)
        for key, value in settings.items():
            self.client.log_param(self.run_id, key, str(value)[:500])

    def on_step_end(self, record: StepRecord) -> None:
        metrics = {"score": record.score, "candidate_score": record.candidate_score,
                   "accepted": None if record.accepted is None else float(record.accepted)}
        for key, value in metrics.items():
            if value is not None and self.run_id:
                self.client.log_metric(self.run_id, key, float(value), step=record.step)

    def on_evaluate_end(self, step: int, result: EvalResult) -> None:
        if result.mean is not None and self.run_id:
            self.client.log_metric(self.run_id, "test_score", float(result.mean), step=step)

    def on_train_end(self, result: TrainResult) -> None:
        if not self.run_id:
            return
        usage = result.usage
        for key, value in {"calls": usage.calls, "tokens": usage.total_tokens, "cost_usd": usage.cost_usd,
                           "accepted_steps": result.accepted, "rejected_steps": result.rejected}.items():
            self.client.log_metric(self.run_id, key, float(value), step=result.steps)
        self.client.log_dict(self.run_id, result.final_parameters, "final_parameters.json")
        if self.report and result.run_dir:
            import tempfile

            from .report import write_report

            with tempfile.TemporaryDirectory() as folder:
                summary = write_report(result.run_dir, folder)
                self.client.log_artifact(self.run_id, summary.png)
                self.client.log_artifact(self.run_id, summary.markdown)
        self.client.set_terminated(self.run_id, "FINISHED" if result.stopped_reason is None else "KILLED")
