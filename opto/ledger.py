"""The run directory: ledger.jsonl, checkpoint.json, metrics.jsonl, eval.jsonl, agent.json.

The ledger holds one typed event (`opto.events.LedgerEvent`) per rollout, proposal,
aggregate candidate and validation decision, linked by ids (`step`, `instance_id`,
`proposal_id`, `candidate_id`). Records are appended with fsync; the checkpoint and
rewrites are atomic (temp file + rename). Nothing is pickled and no API key is ever
written. `RunDirWriter` is the training loop's sink for all of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ._io import append_jsonl, atomic_write_json, atomic_write_jsonl, read_jsonl, repair_jsonl
from .callbacks import Callback
from .events import LedgerEvent, StepRecord, parse_event
from .llm.usage import UsageStats

__all__ = ["Checkpoint", "RunDir", "RunDirWriter"]

CHECKPOINT_VERSION = 1


class Checkpoint(BaseModel):
    """Everything needed to continue a run after its last completed step."""

    version: int = CHECKPOINT_VERSION
    step: int = 0
    epoch: int = 0
    loader_state: dict[str, Any] = Field(default_factory=dict)
    parameters: dict[str, Any] = Field(default_factory=dict)
    usage: dict[str, UsageStats] = Field(default_factory=dict)
    accepted: int = 0
    rejected: int = 0
    no_update: int = 0
    train_scores: list[float | None] = Field(default_factory=list)
    test_scores: list[tuple[int, float | None]] = Field(default_factory=list)
    config: dict[str, Any] = Field(default_factory=dict)
    finished: bool = False
    # The metrics line of the last step while its evaluation has not finished: a stop
    # during that evaluation keeps the step, and resume evaluates again and writes it.
    pending_metrics: dict[str, Any] | None = None
    # The values with the best validation score so far: {"step", "score", "parameters"}.
    best: dict[str, Any] | None = None
    # The values the run started from (for reports).
    initial_parameters: dict[str, Any] = Field(default_factory=dict)
    # What the trainer keeps between steps (e.g. the Pareto candidate pool).
    trainer_state: dict[str, Any] = Field(default_factory=dict)


class RunDir:
    """One training run's files. Create it with the folder; it is made if missing."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.ledger_path = self.path / "ledger.jsonl"
        self.checkpoint_path = self.path / "checkpoint.json"
        self.metrics_path = self.path / "metrics.jsonl"
        self.eval_path = self.path / "eval.jsonl"
        self.agent_path = self.path / "agent.json"
        self.best_path = self.path / "best.json"

    def append_events(self, events: list[LedgerEvent]) -> None:
        """Append events to the ledger (one JSON line each)."""
        append_jsonl(self.ledger_path, [e.model_dump(mode="json") for e in events])

    def log_metrics(self, metrics: dict[str, Any]) -> None:
        append_jsonl(self.metrics_path, [metrics])

    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """The checkpoint, and `agent.json`: its parameter values, loadable with `Agent.load`."""
        atomic_write_json(self.checkpoint_path, checkpoint.model_dump(mode="json"))
        if checkpoint.parameters:
            atomic_write_json(self.agent_path, checkpoint.parameters)
        if checkpoint.best is not None:
            atomic_write_json(self.best_path, checkpoint.best)

    def log_evaluation(self, step: int, rollouts: list[Any]) -> None:
        """One `eval.jsonl` line per example of an evaluation after `step` (0: before training)."""
        append_jsonl(self.eval_path, [{"step": step, "example_id": r.example_id, "output": r.output, "score": r.score,
                                       "error": r.error} for r in rollouts])

    def evaluations(self) -> list[dict[str, Any]]:
        return read_jsonl(self.eval_path)

    def load_checkpoint(self) -> Checkpoint | None:
        if not self.checkpoint_path.exists():
            return None
        try:
            return Checkpoint.model_validate_json(self.checkpoint_path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ValueError(f"{self.checkpoint_path} is not a valid opto checkpoint: {exc}") from exc

    def ledger(self) -> list[dict[str, Any]]:
        """The ledger's records as dicts (any version)."""
        return read_jsonl(self.ledger_path)

    def events(self, kind: str | None = None) -> list[LedgerEvent]:
        """The ledger's records as typed events, optionally only those of one `type`."""
        return [parse_event(r) for r in self.ledger() if kind is None or r.get("type") == kind]

    def metrics(self) -> list[dict[str, Any]]:
        return read_jsonl(self.metrics_path)

    def discard_after(self, step: int, *, metrics_step: int | None = None) -> None:
        """Drop records of steps after `step` (work of an interrupted step, redone on resume).

        Metrics lines are kept up to `metrics_step` (default `step`): a step whose
        evaluation was interrupted keeps its ledger records but gets its line again.
        Torn last lines from a crash mid-append are repaired first.
        """
        owed = step if metrics_step is None else metrics_step
        limits = {self.ledger_path: step, self.metrics_path: owed, self.eval_path: owed}
        for path, limit in limits.items():
            repair_jsonl(path)
            records = read_jsonl(path)
            kept = [r for r in records if r.get("step", 0) <= limit]
            if path == self.metrics_path:  # the final test line is written again when the resumed run finishes
                kept = [r for r in kept if not r.get("final")]
            if len(kept) != len(records):
                atomic_write_jsonl(path, kept)

    def reset(self) -> None:
        """Start afresh: remove the files of an earlier run in this folder."""
        for path in (self.ledger_path, self.checkpoint_path, self.metrics_path, self.eval_path, self.agent_path,
                     self.best_path):
            path.unlink(missing_ok=True)


class RunDirWriter(Callback):
    """The training loop's sink for a `RunDir`: a step's events go to the ledger when the
    step ends; the loop also hands it metrics lines and checkpoints. Unlike a user's
    callback, a failure here is not swallowed: the run must know its files are not written.
    """

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self._pending: list[LedgerEvent] = []

    def on_event(self, event: LedgerEvent) -> None:
        self._pending.append(event)

    def on_step_end(self, record: StepRecord) -> None:
        self.flush()

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        self.run.append_events(pending)

    def on_evaluate_end(self, step: int, result: Any) -> None:
        self.run.log_evaluation(step, result.rollouts)

    def keep_unfinished(self, record: StepRecord | None) -> None:
        """A step stopped part-way: keep what it did for audit (resume discards and redoes it)."""
        if record is not None:
            self._pending.extend(record.events)
        self.flush()
