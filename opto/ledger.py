"""The run directory: ledger.jsonl, checkpoint.json, metrics.jsonl, eval.jsonl, agent.json.

The ledger holds one typed event (`opto.events.LedgerEvent`) per rollout, proposal,
aggregate candidate and validation decision, linked by ids (`step`, `instance_id`,
`proposal_id`, `candidate_id`). Records are appended with fsync; the checkpoint and
rewrites are atomic (temp file + rename). Nothing is pickled and no API key is ever
written. `RunDirWriter` is the training loop's sink for all of it.
"""

from __future__ import annotations

from collections.abc import Callable
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
    # The 95% interval of each test score: {step: [low, high]} (None: nothing was scored).
    test_intervals: dict[int, list[float] | None] = Field(default_factory=dict)
    config: dict[str, Any] = Field(default_factory=dict)
    finished: bool = False
    # The metrics line of the last step while its evaluation has not finished: a stop
    # during that evaluation keeps the step, and resume evaluates again and writes it.
    pending_metrics: dict[str, Any] | None = None
    # The values with the best validation score so far: {"step", "score", "parameters"}.
    best: dict[str, Any] | None = None
    # Steps whose final evaluation is recorded: their `"final": true` lines in eval.jsonl and
    # metrics.jsonl are kept on resume (those of any other step are of an interrupted
    # final evaluation, which is done again).
    final_evaluations: list[int] = Field(default_factory=list)
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

    def log_evaluation(self, step: int, rollouts: list[Any], *, final: bool = False) -> None:
        """One `eval.jsonl` line per example of an evaluation after `step` (0: before training);
        the lines of the run's final evaluation also say `"final": true`."""
        marker = {"final": True} if final else {}
        append_jsonl(self.eval_path, [{"step": step, "example_id": r.example_id, "output": r.output, "score": r.score,
                                       "error": r.error, **marker} for r in rollouts])

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

    def discard_unsaved(self, saved: Checkpoint) -> None:
        """Drop the lines a resumed run writes again: those the checkpoint `saved` does not record.

        Kept: ledger records up to the saved step; metrics and evaluation lines up to it,
        except a step's line the checkpoint still owes (`pending_metrics`: the step's
        evaluation, or the final line, was interrupted) and the `"final"` lines of any
        step not in `saved.final_evaluations`. Torn last lines from a crash mid-append are
        repaired first. A finished run's files are left exactly as they are.
        """
        owed = saved.pending_metrics or {}
        owed_final = saved.step if owed.get("final") else None
        lines_up_to = saved.step - 1 if owed and owed_final is None else saved.step
        finals = set(saved.final_evaluations) - {owed_final}
        self._keep(self.ledger_path, lambda r: r.get("step", 0) <= saved.step)
        self._keep(self.metrics_path, lambda r: r.get("step", 0) <= lines_up_to and (
            not r.get("final") or r.get("step") in finals))
        self._keep(self.eval_path, lambda r: r.get("step", 0) <= lines_up_to and (
            not r.get("final") or r.get("step") in saved.final_evaluations))

    @staticmethod
    def _keep(path: Path, keep: Callable[[dict[str, Any]], bool]) -> None:
        """Rewrite a JSONL file with only the records `keep` accepts (untouched if that is all)."""
        repair_jsonl(path)
        records = read_jsonl(path)
        kept = [r for r in records if keep(r)]
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

    def keep_unfinished(self, record: StepRecord | None) -> None:
        """A step stopped part-way: keep what it did for audit (resume discards and redoes it)."""
        if record is not None:
            self._pending.extend(record.events)
        self.flush()
