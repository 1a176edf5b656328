"""Experiment tracking: a run's settings, scores, usage and report in a tracker (MLflow).

It sits above the ledger and the report (it logs `opto report`'s picture), so the
`Callback` base that those import stays free of them.
"""

from __future__ import annotations

import tempfile
from typing import TYPE_CHECKING, Any

from ..errors import MissingDependencyError
from ..run.callbacks import Callback
from .markdown import write_report

if TYPE_CHECKING:
    from ..run.events import StepRecord
    from ..run.results import EvalResult, TrainResult

__all__ = ["MLflowCallback"]


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

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str = "opto",
        run_name: str | None = None,
        report: bool = True,
    ) -> None:
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as exc:
            raise MissingDependencyError(
                'MLflowCallback needs MLflow: pip install -e ".[mlflow]" (or mlflow-skinny)'
            ) from exc
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
        metrics = {
            "score": record.score,
            "candidate_score": record.candidate_score,
            "accepted": None if record.accepted is None else float(record.accepted),
        }
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
        for key, value in {
            "calls": usage.calls,
            "tokens": usage.total_tokens,
            "cost_usd": usage.cost_usd,
            "accepted_steps": result.accepted,
            "rejected_steps": result.rejected,
        }.items():
            self.client.log_metric(self.run_id, key, float(value), step=result.steps)
        self.client.log_dict(self.run_id, result.final_parameters, "final_parameters.json")
        if self.report and result.run_dir:
            with tempfile.TemporaryDirectory() as folder:
                summary = write_report(result.run_dir, folder)
                self.client.log_artifact(self.run_id, summary.png)
                self.client.log_artifact(self.run_id, summary.markdown)
        self.client.set_terminated(self.run_id, "FINISHED" if result.stopped_reason is None else "KILLED")
