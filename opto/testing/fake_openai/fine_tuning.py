"""The files and fine-tuning jobs part of `FakeOpenAIServer`: one `FineTuningJob` per job."""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .http import RecordedRequest, Response, error, estimate_tokens, json_response, new_id, parse_multipart

__all__ = ["FineTuningAPI", "FineTuningJob", "StoredFile"]

_TERMINAL_JOB_STATUSES = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class StoredFile:
    """A file uploaded through `POST /v1/files`."""

    id: str
    filename: str
    purpose: str
    content: bytes
    created_at: int

    def to_json(self) -> dict[str, Any]:
        """The OpenAI `FileObject` representation."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.content),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
            "expires_at": None,
        }


@dataclass
class FineTuningJob:
    """One job: the JSON the API returns, its scripted statuses, its events."""

    data: dict[str, Any]
    script: list[str]
    training_tokens: int
    step: int = 0
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.data["status"] in _TERMINAL_JOB_STATUSES

    def advance(self, failure_error: dict[str, Any]) -> None:
        """The next scripted status, if any (each status read moves the job on one)."""
        if not self.finished and self.step + 1 < len(self.script):
            self.step += 1
            self.enter(self.script[self.step], failure_error)

    def enter(self, status: str, failure_error: dict[str, Any]) -> None:
        """Move to `status`, filling the fields that status implies."""
        self.data["status"] = status
        self.add_event(f"Job status changed to {status}")
        if status in _TERMINAL_JOB_STATUSES:
            self.data["finished_at"] = int(time.time())
        if status == "succeeded":
            short_id = self.data["id"].split("-", 1)[1][:8]
            self.data["fine_tuned_model"] = f"ft:{self.data['model']}:{self.data['suffix'] or 'opto'}:{short_id}"
            self.data["trained_tokens"] = self.training_tokens
        elif status == "failed":
            self.data["error"] = dict(failure_error)
            self.add_event(str(failure_error.get("message", "The job failed.")), level="error")

    def add_event(self, message: str, level: str = "info") -> None:
        self.events.append(
            {
                "object": "fine_tuning.job.event",
                "id": new_id("ftevent"),
                "created_at": int(time.time()),
                "level": level,
                "message": message,
                "type": "message",
                "data": None,
            }
        )


class FineTuningAPI:
    """`/v1/files` and `/v1/fine_tuning/jobs`, with scripted job statuses and failures.

    Attributes:
        job_script: the statuses a new fine-tuning job walks through, one per
            `GET /v1/fine_tuning/jobs/{id}`; copied when the job is created.
        job_failure_error: the `error` of a job whose script reaches "failed".
    """

    _lock: threading.Lock

    def _init_fine_tuning(self) -> None:
        self.job_script: list[str] = ["validating_files", "queued", "running", "succeeded"]
        self.job_failure_error: dict[str, Any] = {
            "code": "invalid_training_file",
            "message": "The training file is not valid (fake failure).",
            "param": "training_file",
        }
        self._files: dict[str, StoredFile] = {}
        self._jobs: dict[str, FineTuningJob] = {}
        self._ft_create_refusal: tuple[int, str] | None = None

    @property
    def files(self) -> dict[str, StoredFile]:
        """Uploaded files by id (a copy)."""
        with self._lock:
            return dict(self._files)

    @property
    def jobs(self) -> dict[str, dict[str, Any]]:
        """Fine-tuning jobs by id, as the JSON the API returns (a deep copy)."""
        with self._lock:
            return {job_id: copy.deepcopy(job.data) for job_id, job in self._jobs.items()}

    def fail_fine_tuning_create(
        self, status: int = 403, message: str = "You are not allowed to fine-tune this model."
    ) -> None:
        """Refuse the next `POST /v1/fine_tuning/jobs` with `status` and `message`."""
        with self._lock:
            self._ft_create_refusal = (status, message)

    # files

    def _upload_file(self, request: RecordedRequest) -> Response:
        content_type = request.headers.get("content-type", "")
        if not content_type.startswith("multipart/form-data"):
            return error(400, "Uploads must be multipart/form-data.")
        fields = parse_multipart(request.body, content_type)
        if "file" not in fields or "purpose" not in fields:
            return error(400, "Both 'file' and 'purpose' fields are required.", param="file")
        filename, content = fields["file"]
        stored = StoredFile(
            id=new_id("file"),
            filename=filename or "upload",
            purpose=fields["purpose"][1].decode(),
            content=content,
            created_at=int(time.time()),
        )
        with self._lock:
            self._files[stored.id] = stored
        return json_response(stored.to_json())

    def _list_files(self, request: RecordedRequest) -> Response:
        with self._lock:
            data = [f.to_json() for f in self._files.values()]
        return json_response({"object": "list", "data": data, "has_more": False})

    def _get_file(self, request: RecordedRequest, file_id: str) -> Response:
        with self._lock:
            stored = self._files.get(file_id)
        if stored is None:
            return error(404, f"No such File object: {file_id}", param="id")
        return json_response(stored.to_json())

    def _get_file_content(self, request: RecordedRequest, file_id: str) -> Response:
        with self._lock:
            stored = self._files.get(file_id)
        if stored is None:
            return error(404, f"No such File object: {file_id}", param="id")
        return Response(200, stored.content, content_type="application/octet-stream")

    # fine-tuning jobs

    def _create_job(self, request: RecordedRequest) -> Response:
        body = request.json if isinstance(request.json, dict) else {}
        with self._lock:
            refusal, self._ft_create_refusal = self._ft_create_refusal, None
            training = self._files.get(str(body.get("training_file")))
            validation_file = body.get("validation_file")
            validation_ok = validation_file is None or validation_file in self._files
        if refusal is not None:
            return error(refusal[0], refusal[1])
        if not body.get("model"):
            return error(400, "Missing required parameter: 'model'.", param="model")
        if training is None:
            return error(400, f"Invalid file ID: {body.get('training_file')!r}", param="training_file")
        if not validation_ok:
            return error(400, f"Invalid file ID: {validation_file!r}", param="validation_file")

        script = list(self.job_script) or ["validating_files"]
        hyperparameters = {"n_epochs": "auto", "batch_size": "auto", "learning_rate_multiplier": "auto"}
        hyperparameters.update(body.get("hyperparameters") or {})
        job_id = new_id("ftjob")
        data: dict[str, Any] = {
            "object": "fine_tuning.job",
            "id": job_id,
            "model": body["model"],
            "created_at": int(time.time()),
            "finished_at": None,
            "fine_tuned_model": None,
            "organization_id": "org-fake",
            "result_files": [],
            "status": script[0],
            "validation_file": validation_file,
            "training_file": training.id,
            "hyperparameters": hyperparameters,
            "method": body.get("method") or {"type": "supervised", "supervised": {"hyperparameters": hyperparameters}},
            "trained_tokens": None,
            "error": None,
            "seed": body.get("seed") if body.get("seed") is not None else 42,
            "suffix": body.get("suffix"),
            "estimated_finish": None,
            "integrations": [],
            "metadata": body.get("metadata"),
        }
        job = FineTuningJob(data, script, estimate_tokens(training.content.decode(errors="replace")))
        with self._lock:
            self._jobs[job_id] = job
            job.add_event(f"Created fine-tuning job: {job_id}")
            job.enter(script[0], self.job_failure_error)
            return json_response(copy.deepcopy(job.data))

    def _list_jobs(self, request: RecordedRequest) -> Response:
        with self._lock:
            data = [copy.deepcopy(job.data) for job in reversed(self._jobs.values())]  # newest first, like the API
        return json_response({"object": "list", "data": data, "has_more": False})

    def _get_job(self, request: RecordedRequest, job_id: str) -> Response:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return error(404, f"Fine-tuning job {job_id} not found.", param="fine_tuning_job_id")
            job.advance(self.job_failure_error)
            return json_response(copy.deepcopy(job.data))

    def _list_job_events(self, request: RecordedRequest, job_id: str) -> Response:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return error(404, f"Fine-tuning job {job_id} not found.", param="fine_tuning_job_id")
            data = copy.deepcopy(list(reversed(job.events)))  # newest first, like the API
        return json_response({"object": "list", "data": data, "has_more": False})

    def _cancel_job(self, request: RecordedRequest, job_id: str) -> Response:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return error(404, f"Fine-tuning job {job_id} not found.", param="fine_tuning_job_id")
            if job.finished:
                return error(400, f"Job has already {job.data['status']}; it cannot be cancelled.")
            job.enter("cancelled", self.job_failure_error)
            return json_response(copy.deepcopy(job.data))
