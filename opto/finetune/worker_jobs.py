"""`WorkerJobAdapter`: an adapter whose jobs run in a child process each, followed through a folder.

`submit` (in a subclass) writes the job's `settings.json` and starts the worker with
`_start_worker`; the worker reports through `job.json`. `status`, `wait_until_complete`
and `cancel` read and write only the job folder, so they work from any process that
knows `output_dir` and the job id. `TRLAdapter` and `ARTAdapter` are built on it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._util.files import atomic_write_json
from ..errors import OptoValueError
from .base import FineTuneError, TrainerAdapter, TrainingJobRef, TrainingJobStatus, job_id_of
from .job_folder import JobFiles, JobState

__all__ = ["WorkerJobAdapter"]


class WorkerJobAdapter(TrainerAdapter):
    """Shared job handling of the adapters that train in a worker process (see the module).

    Subclasses set `backend` and `worker_module` and keep `output_dir` and `cancel_grace`.
    """

    worker_module: str
    output_dir: Path
    cancel_grace: float

    def state_dict(self) -> dict[str, Any]:
        """Refused: the jobs' state is their folders, which any process reads."""
        raise OptoValueError(
            f"{type(self).__name__} saves no state: its jobs live in their folders under its output_dir, "
            "so a new adapter on the same output_dir follows them"
        )

    def _new_job(self, settings: Mapping[str, Any]) -> JobFiles:
        """A fresh job folder holding `settings.json` and a queued `job.json`."""
        job_id = f"{self.backend}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        files = JobFiles(self.output_dir / job_id)
        files.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(files.settings, dict(settings))
        files.write_state(JobState(job_id=job_id, message="queued"))
        return files

    def _start_worker(self, files: JobFiles, env: Mapping[str, str] | None = None) -> None:
        """Start `python -m <worker_module> <folder>`, logging to the job's log file."""
        if not hasattr(self, "_processes"):
            self._processes: dict[str, subprocess.Popen[bytes]] = {}
        with files.log.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", self.worker_module, str(files.folder)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **dict(env or {})},
                start_new_session=True,
            )  # its own group: survives a Ctrl-C of the caller
        files.write_process(process.pid)
        self._processes[files.folder.name] = process

    async def status(self, ref: TrainingJobRef | str) -> TrainingJobStatus:
        """The job's state, read from its folder (so from any process).

        A worker that died without writing a final state (killed, out of memory) is
        reported as failed, with the end of its log.
        """
        job_id = job_id_of(ref)
        files = self._files(job_id)
        state = files.read_state()
        if not state.done and not self._worker_alive(job_id, files):
            state = files.read_state()  # it may have finished between the two reads
            if not state.done:
                tail = files.log_tail()
                state = state.model_copy(
                    update={
                        "status": "failed",
                        "finished_at": time.time(),
                        "progress": None,
                        "error": "the worker process ended without a result" + (f": {tail}" if tail else ""),
                        "message": f"the worker process ended without a result (see {files.log.name})",
                    }
                )
                files.write_state(state)
        return TrainingJobStatus(
            job_id=job_id,
            status=state.status,
            raw_status=state.status,
            progress=state.progress,
            message=state.message,
            fine_tuned_model=state.fine_tuned_model,
            error=state.error,
        )

    async def cancel(self, ref: TrainingJobRef | str) -> TrainingJobStatus:
        """Stop the job (from any process): the worker stops at its next check of the
        `cancel` file; one that does not within `cancel_grace` seconds is sent SIGTERM."""
        job_id = job_id_of(ref)
        files = self._files(job_id)
        if files.read_state().done:
            return await self.status(job_id)
        files.cancel.touch()
        deadline = time.monotonic() + self.cancel_grace
        while time.monotonic() < deadline:
            if files.read_state().done or not self._worker_alive(job_id, files):
                break
            await asyncio.sleep(0.1)
        if not files.read_state().done:
            pid = files.live_pid()
            if pid is not None:
                try:
                    os.killpg(pid, signal.SIGTERM)  # the worker leads its own process group
                except ProcessLookupError:
                    pass
                await asyncio.to_thread(self._reap, job_id)
            state = files.read_state()
            if not state.done:
                files.write_state(
                    state.model_copy(
                        update={
                            "status": "cancelled",
                            "finished_at": time.time(),
                            "message": "cancelled (the worker was terminated)",
                        }
                    )
                )
        return await self.status(job_id)

    def join(self, ref: TrainingJobRef | str, timeout: float | None = None) -> None:
        """Block until a job this adapter started has ended (sync code with nothing else to do)."""
        process = getattr(self, "_processes", {}).get(job_id_of(ref))
        if process is not None:
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass

    def _files(self, job_id: str) -> JobFiles:
        files = JobFiles(self.output_dir / job_id)
        if not files.state.is_file():
            raise FineTuneError(f"no {self.backend.upper()} job {job_id!r} in {self.output_dir}")
        return files

    def _worker_alive(self, job_id: str, files: JobFiles) -> bool:
        process = getattr(self, "_processes", {}).get(job_id)
        if process is not None:  # our own child: poll() also reaps it
            return process.poll() is None
        if not files.process.is_file():  # submitted a moment ago: the pid is not written yet
            return True
        return files.live_pid() is not None

    def _reap(self, job_id: str) -> None:
        process = getattr(self, "_processes", {}).get(job_id)
        if process is not None:
            try:
                process.wait(timeout=self.cancel_grace)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
