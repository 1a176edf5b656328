"""The files of one job folder, shared by an adapter (`TRLAdapter`, `ARTAdapter`) and its worker process."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from .._util.files import atomic_write_json, atomic_write_text
from .base import TERMINAL_STATES
from .base import JobState as Status

__all__ = ["DEFAULT_LORA", "JobFiles", "JobState"]

DEFAULT_LORA: dict[str, Any] = {
    "r": 8,
    "lora_alpha": 16,
    "lora_dropout": 0.05,
    "target_modules": "all-linear",
    "task_type": "CAUSAL_LM",
}


class JobState(BaseModel):
    """What `job.json` holds."""

    job_id: str
    status: Status = "pending"
    progress: float | None = 0.0
    message: str = ""
    fine_tuned_model: str | None = None
    error: str | None = None
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def done(self) -> bool:
        return self.status in TERMINAL_STATES


class JobFiles:
    """Paths and small readers/writers of a job folder (every write is atomic)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.state = folder / "job.json"
        self.settings = folder / "settings.json"
        self.process = folder / "process.json"
        self.cancel = folder / "cancel"
        self.log = folder / "train.log"
        self.model = folder / "model"

    def read_state(self) -> JobState:
        return JobState.model_validate_json(self.state.read_text(encoding="utf-8"))

    def write_state(self, state: JobState) -> None:
        atomic_write_text(self.state, state.model_dump_json(indent=2) + "\n")

    def update(self, **fields: Any) -> JobState:
        """The state with `fields` changed, written (only the worker calls this while it runs)."""
        state = self.read_state().model_copy(update=fields)
        self.write_state(state)
        return state

    def write_process(self, pid: int) -> None:
        atomic_write_json(self.process, {"pid": pid, "start": _start_time(pid), "written_at": time.time()})

    def live_pid(self) -> int | None:
        """The worker's pid while that very process runs (not a finished one, nor a new
        process that was given the same pid)."""
        import json

        try:
            saved = json.loads(self.process.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        pid = int(saved.get("pid", 0))
        if pid <= 0:
            return None
        stat = Path(f"/proc/{pid}/stat")
        if stat.parent.parent.is_dir() and Path("/proc/self").exists():
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                return None
            # fields[0] is the state (Z: exited, not yet reaped); fields[19] the start time.
            if fields[0] == "Z" or (saved.get("start") is not None and fields[19] != saved["start"]):
                return None
            return pid
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return pid

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell it from a later
    process given the same pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
