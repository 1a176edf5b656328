"""The run directory: ledger.jsonl, checkpoint.json, metrics.jsonl, eval.jsonl, agent.json.

The ledger holds one typed event (`opto.run.events.LedgerEvent`) per rollout, proposal,
aggregate candidate and validation decision, linked by ids (`step`, `instance_id`,
`proposal_id`, `candidate_id`). Records are appended with fsync; the checkpoint and
rewrites are atomic (temp file + rename). Nothing is pickled and no API key is ever
written. `RunDirWriter` is the training loop's sink for all of it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, NonNegativeInt, ValidationError, model_validator

from .._util.files import (
    append_jsonl,
    atomic_write_json,
    atomic_write_jsonl,
    read_jsonl,
    remove_stale_temp_files,
    repair_jsonl,
)
from ..errors import OptoValueError, RunDirError, RunDirWriteError
from ..llm.usage import UsageStats
from .callbacks import Callback
from .events import LedgerEvent, StepRecord, parse_event

__all__ = ["Checkpoint", "RunDir", "RunDirWriter", "damaged", "read_json_object"]

CHECKPOINT_VERSION = 1

# Keys every checkpoint opto ever wrote has: one without them is damaged, not old.
_REQUIRED_KEYS = (
    "version",
    "step",
    "epoch",
    "loader_state",
    "parameters",
    "config",
    "accepted",
    "rejected",
    "no_update",
    "train_scores",
    "test_scores",
    "finished",
)
_ADVICE = (
    "Nothing in the folder was changed. Restore the file from a backup, or start a new run in another "
    "run_dir (the files there can still be read, e.g. with `opto report`)."
)


def damaged(path: Path, what: str) -> RunDirError:
    """The error for a damaged run file: which file, what is wrong in it, what to do."""
    return RunDirError(f"cannot resume from {path}: {what}. {_ADVICE}")


def read_json_object(path: Path) -> dict[str, Any]:
    """A run file that holds one JSON object; anything else is `damaged`."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise damaged(path, f"it is not valid JSON ({exc}); it may be truncated") from None
    if not isinstance(value, dict):
        raise damaged(path, f"it holds a JSON {type(value).__name__}, not an object")
    return value


class Checkpoint(BaseModel):
    """Everything needed to continue a run after its last completed step."""

    version: int = CHECKPOINT_VERSION
    step: NonNegativeInt = 0
    epoch: NonNegativeInt = 0
    loader_state: dict[str, Any] = Field(default_factory=dict)
    parameters: dict[str, Any] = Field(default_factory=dict)
    usage: dict[str, UsageStats] = Field(default_factory=dict)
    accepted: NonNegativeInt = 0
    rejected: NonNegativeInt = 0
    no_update: NonNegativeInt = 0
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
    # How many ledger records of steps up to `step` are written (None: a checkpoint from
    # before this was kept); resume checks the ledger against it.
    ledger_records: NonNegativeInt | None = None
    # Failed rollouts (the agent or guide raised): per step's batch, and per test evaluation.
    train_failed: list[NonNegativeInt] = Field(default_factory=list)
    test_failed: dict[int, NonNegativeInt] = Field(default_factory=dict)
    # Rejected candidates that scored above the current values, and the largest such win
    # (a decision record with its step): what `opto.trainer.diagnosis` explains.
    rejected_wins: NonNegativeInt = 0
    best_rejected_win: dict[str, Any] | None = None
    # The final check's `FinalCheckResult` once it ran (a resumed run does not run it again).
    final_check: dict[str, Any] | None = None
    # Rollouts run so far (GEPA's metric calls), earlier sessions included.
    rollouts: NonNegativeInt = 0

    @model_validator(mode="after")
    def _consistent(self) -> Checkpoint:
        """What every checkpoint opto writes satisfies, so a damaged one is caught on load."""
        if self.version > CHECKPOINT_VERSION:
            raise OptoValueError(
                f"version: {self.version} was written by a newer opto (this one reads "
                f"{CHECKPOINT_VERSION}); upgrade opto to resume it"
            )
        if self.accepted + self.rejected + self.no_update != self.step:
            raise OptoValueError(
                f"step: {self.step} steps, but accepted + rejected + no_update = "
                f"{self.accepted} + {self.rejected} + {self.no_update}"
            )
        if len(self.train_scores) != self.step:
            raise OptoValueError(f"train_scores: {len(self.train_scores)} scores for {self.step} steps")
        if self.step > 0 and not self.loader_state:
            raise OptoValueError(f"loader_state: empty after {self.step} steps")
        scored = [step for step, _ in self.test_scores]
        beyond = [s for s in [*scored, *self.final_evaluations, *self.test_intervals] if not 0 <= s <= self.step]
        if beyond:
            raise OptoValueError(f"test_scores: an evaluation at step {beyond[0]}, outside 0..{self.step}")
        if self.best is not None and not (
            isinstance(self.best.get("step"), int)
            and 0 <= self.best["step"] <= self.step
            and isinstance(self.best.get("parameters"), dict)
        ):
            raise OptoValueError("best: needs a step within 0..step and a parameters object")
        if self.pending_metrics is not None and self.pending_metrics.get("step") != self.step:
            raise OptoValueError(
                f"pending_metrics: owes step {self.pending_metrics.get('step')!r}, not the "
                f"checkpoint's step {self.step}"
            )
        return self


class RunDir:
    """One training run's files. Create it with the folder; it is made if missing."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise RunDirError(f"run_dir {self.path} is a file; give a folder (it is made if missing)")
        self.path.mkdir(parents=True, exist_ok=True)
        self.ledger_path = self.path / "ledger.jsonl"
        self.checkpoint_path = self.path / "checkpoint.json"
        self.metrics_path = self.path / "metrics.jsonl"
        self.eval_path = self.path / "eval.jsonl"
        self.agent_path = self.path / "agent.json"
        self.best_path = self.path / "best.json"
        self.estimate_path = self.path / "estimate.json"  # train(confirm=...)'s estimate, kept by the first start

    @property
    def files(self) -> tuple[Path, ...]:
        return (
            self.ledger_path,
            self.checkpoint_path,
            self.metrics_path,
            self.eval_path,
            self.agent_path,
            self.best_path,
        )

    @contextlib.contextmanager
    def _writing(self, path: Path) -> Iterator[None]:
        """An OSError while writing `path` becomes a `RunDirWriteError` that names it."""
        try:
            yield
        except OSError as exc:
            if isinstance(exc, RunDirWriteError):
                raise
            raise RunDirWriteError(
                exc.errno,
                f"could not write {path.name} in {self.path} ({exc.strerror or exc}): "
                "the run stops after keeping what it can; train(..., resume=True) continues "
                "from the last saved step once the disk is writable",
            ) from exc

    def append_events(self, events: list[LedgerEvent]) -> None:
        """Append events to the ledger (one JSON line each): all of them, or none."""
        with self._writing(self.ledger_path):
            append_jsonl(self.ledger_path, [e.model_dump(mode="json") for e in events])

    def log_metrics(self, metrics: dict[str, Any]) -> None:
        with self._writing(self.metrics_path):
            append_jsonl(self.metrics_path, [metrics])

    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """`agent.json` (the parameter values, loadable with `Agent.load`), `best.json`, then
        the checkpoint: written last, it never counts more than the files beside it hold."""
        if checkpoint.parameters:
            with self._writing(self.agent_path):
                atomic_write_json(self.agent_path, checkpoint.parameters)
        if checkpoint.best is not None:
            with self._writing(self.best_path):
                atomic_write_json(self.best_path, checkpoint.best)
        with self._writing(self.checkpoint_path):
            atomic_write_json(self.checkpoint_path, checkpoint.model_dump(mode="json"))

    def log_evaluation(self, step: int, rollouts: list[Any], *, final: bool = False) -> None:
        """One `eval.jsonl` line per example of an evaluation after `step` (0: before training);
        the lines of the run's final evaluation also say `"final": true`."""
        marker = {"final": True} if final else {}
        with self._writing(self.eval_path):
            append_jsonl(
                self.eval_path,
                [
                    {
                        "step": step,
                        "example_id": r.example_id,
                        "output": r.output,
                        "score": r.score,
                        "error": r.error,
                        **marker,
                    }
                    for r in rollouts
                ],
            )

    def evaluations(self) -> list[dict[str, Any]]:
        return read_jsonl(self.eval_path)

    def load_checkpoint(self) -> Checkpoint | None:
        """The saved checkpoint (None if there is none); a damaged one is a `RunDirError`
        naming the field, and is left as it is."""
        path = self.checkpoint_path
        if not path.exists():
            return None
        raw = read_json_object(path)
        missing = [key for key in _REQUIRED_KEYS if key not in raw]
        if missing:
            raise damaged(path, f"it has no {', '.join(missing)} field{'s' if len(missing) > 1 else ''}")
        try:
            return Checkpoint.model_validate(raw)
        except ValidationError as exc:
            raise damaged(path, describe_validation(exc)) from None

    def remove_stale_temp_files(self) -> None:
        """Remove temp files that a killed process left while rewriting one of the run's files."""
        for path in self.files:
            remove_stale_temp_files(path)

    def holds_a_run(self) -> bool:
        """Whether the files a run appends to (ledger, metrics, evaluations) have content:
        they are written only after a first checkpoint, which agent.json and best.json,
        rewritten from each checkpoint, can precede."""
        return any(
            path.exists() and path.stat().st_size > 0 for path in (self.ledger_path, self.metrics_path, self.eval_path)
        )

    def reset(self) -> None:
        """Before a new run in a folder that holds none (`holds_a_run()` is False): remove
        what an earlier start left (empty files, agent.json before its first checkpoint)."""
        for path in self.files:
            path.unlink(missing_ok=True)

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

        Kept: ledger records up to the saved step, as many as it counts (a final check
        stopped before its checkpoint wrote rollouts it does not count); metrics lines up to it, except a step's
        line the checkpoint still owes (`pending_metrics`: the step's evaluation, or the
        final line, was interrupted) and the `"final"` lines of any step not in
        `saved.final_evaluations`; evaluation lines of the evaluations the checkpoint
        scored. Torn last lines from a crash mid-append are repaired first. A finished
        run's files are left exactly as they are.
        """
        owed = saved.pending_metrics or {}
        owed_final = saved.step if owed.get("final") else None
        lines_up_to = saved.step - 1 if owed and owed_final is None else saved.step
        finals = set(saved.final_evaluations) - {owed_final}
        scored = {step for step, _ in saved.test_scores}
        kept = 0

        def counted(record: dict[str, Any]) -> bool:  # up to the saved step, as many as the checkpoint counts
            nonlocal kept
            kept += record.get("step", 0) <= saved.step
            return record.get("step", 0) <= saved.step and (
                saved.ledger_records is None or kept <= saved.ledger_records
            )

        self._keep(self.ledger_path, counted)
        self._keep(
            self.metrics_path,
            lambda r: r.get("step", 0) <= lines_up_to and (not r.get("final") or r.get("step") in finals),
        )
        self._keep(
            self.eval_path,
            lambda r: r.get("step") in saved.final_evaluations if r.get("final") else r.get("step") in scored,
        )

    @staticmethod
    def _keep(path: Path, keep: Callable[[dict[str, Any]], bool]) -> None:
        """Rewrite a JSONL file with only the records `keep` accepts (untouched if that is all)."""
        repair_jsonl(path)
        records = read_jsonl(path)
        kept = [r for r in records if keep(r)]
        if len(kept) != len(records):
            atomic_write_jsonl(path, kept)


class RunDirWriter(Callback):
    """The training loop's sink for a `RunDir`: a step's events go to the ledger when the
    step ends; the loop also hands it checkpoints. Unlike a user's callback, a failure
    here is not swallowed: the run must know its files are not written.

    Events whose append failed stay pending (the failed append left nothing behind) and
    are written by the next flush; `owes(step)` tells whether a checkpoint of `step`
    would count records that are not in the ledger.
    """

    def __init__(self, run: RunDir, written: int = 0) -> None:
        self.run = run
        self._pending: list[LedgerEvent] = []
        self._written_by_step: dict[int, int] = {0: written}

    def on_event(self, event: LedgerEvent) -> None:
        self._pending.append(event)

    def on_step_end(self, record: StepRecord) -> None:
        self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        self.run.append_events(self._pending)
        for event in self._pending:
            self._written_by_step[event.step] = self._written_by_step.get(event.step, 0) + 1
        self._pending = []

    def owes(self, step: int) -> bool:
        """Whether events of a step up to `step` are not written yet."""
        return any(event.step <= step for event in self._pending)

    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Save `checkpoint` with the count of ledger records it covers."""
        checkpoint.ledger_records = sum(n for step, n in self._written_by_step.items() if step <= checkpoint.step)
        self.run.save_checkpoint(checkpoint)

    def keep_unfinished(self, record: StepRecord | None) -> None:
        """A step stopped part-way: keep what it did for audit (resume discards and redoes it)."""
        if record is not None:
            self._pending.extend(record.events)
        self.flush()


def describe_validation(exc: ValidationError) -> str:
    """A pydantic error as 'field: what is wrong (the value)' lines, for a person."""
    parts = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"]) or "the file"
        message = error["msg"].removeprefix("Value error, ")
        found = (
            ""
            if field == "the file" or isinstance(error.get("input"), (dict, list))
            else f" (found {error.get('input')!r})"
        )
        parts.append(
            f"{message}{found}"
            if message.startswith(f"{field}:") or field == "the file"
            else f"{field}: {message}{found}"
        )
    return "; ".join(parts)
