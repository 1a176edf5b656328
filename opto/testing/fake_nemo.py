"""`FakeNeMoCustomizer`: the NeMo Microservices endpoints `NeMoCustomizerAdapter` uses, offline.

One real HTTP server on 127.0.0.1 plays the three services (Data Store, Entity Store and
Customizer share its root URL), following NeMo Microservices' public v1 API:

- Data Store (Hugging Face Hub API): `POST /v1/hf/api/repos/create` and
  `POST /v1/hf/api/datasets/{namespace}/{name}/commit/main` (NDJSON commit, base64 files);
- Entity Store: `POST /v1/datasets`, `GET /v1/datasets/{namespace}/{name}`;
- Customizer: `POST /v1/customization/jobs`, `GET /v1/customization/jobs/{id}`,
  `GET /v1/customization/jobs/{id}/status`, `POST /v1/customization/jobs/{id}/cancel`.

Jobs walk through `job_script`, one status per status request; `fail_job_creation`
makes the next job creation answer with an error.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .fake_openai.http import RecordedRequest, Response, json_response, new_id
from .fake_openai.routed import RoutedServer

__all__ = ["FakeNeMoCustomizer", "FakeNeMoJob"]


def _detail(status: int, message: str) -> Response:
    """An error in the shape NeMo Microservices (FastAPI) answers with."""
    return json_response({"detail": message}, status)


@dataclass
class FakeNeMoJob:
    """One customization job: its request, its scripted statuses and where it is in them."""

    id: str
    request: dict[str, Any]
    script: list[str]
    error: str
    position: int = 0
    cancelled: bool = False

    @property
    def status(self) -> str:
        return "cancelled" if self.cancelled else self.script[min(self.position, len(self.script) - 1)]

    def advance(self) -> None:
        if not self.cancelled:
            self.position = min(self.position + 1, len(self.script) - 1)

    def body(self) -> dict[str, Any]:
        done = {"completed": 100.0, "running": 50.0}.get(self.status, 0.0)
        logs = [{"message": self.error, "detail": self.error}] if self.status == "failed" else []
        return {
            "id": self.id,
            "status": self.status,
            "percentage_done": done,
            "status_logs": logs,
            "output_model": self.request.get("output_model"),
            "config": self.request.get("config"),
            "dataset": self.request.get("dataset"),
            "hyperparameters": self.request.get("hyperparameters"),
        }


class FakeNeMoCustomizer(RoutedServer):
    """A fake NeMo Data Store, Entity Store and Customizer on one local port.

    Attributes:
        job_script: the statuses a new job walks through, one per status request (copied
            when the job is created); end it with "failed" to make jobs fail.
        job_error: the message a failed job reports.
        files: {"namespace/name/path": bytes} uploaded to the Data Store.
        datasets: {"namespace/name": body} registered in the Entity Store.
        jobs: {job id: FakeNeMoJob}.
    """

    def __init__(
        self, *, port: int = 0, job_script: list[str] | None = None, job_error: str = "training diverged (fake)"
    ) -> None:
        self.job_script = list(job_script or ["created", "running", "completed"])
        self.job_error = job_error
        self.files: dict[str, bytes] = {}
        self.repos: set[str] = set()
        self.datasets: dict[str, dict[str, Any]] = {}
        self.jobs: dict[str, FakeNeMoJob] = {}
        self._creation_failures: list[tuple[int, str]] = []
        self._init_server(port)

    @property
    def base_url(self) -> str:
        """The root URL of all three services, e.g. "http://127.0.0.1:54321"."""
        return self.root_url

    def fail_job_creation(self, status: int = 422, message: str = "config not found (fake)") -> None:
        """Answer the next job creation with `status` and `message`."""
        with self._lock:
            self._creation_failures.append((status, message))

    def _routes(self) -> list[tuple[str, str, Callable[..., Response | None]]]:
        return [
            ("POST", r"/v1/hf/api/repos/create", self._create_repo),
            ("POST", r"/v1/hf/api/datasets/([^/]+)/([^/]+)/commit/main", self._commit),
            ("POST", r"/v1/datasets", self._register_dataset),
            ("GET", r"/v1/datasets/([^/]+)/([^/]+)", self._get_dataset),
            ("POST", r"/v1/customization/jobs", self._create_job),
            ("GET", r"/v1/customization/jobs", self._list_jobs),
            ("GET", r"/v1/customization/jobs/([^/]+)", self._get_job),
            ("GET", r"/v1/customization/jobs/([^/]+)/status", self._job_status),
            ("POST", r"/v1/customization/jobs/([^/]+)/cancel", self._cancel_job),
        ]

    # -- Data Store ------------------------------------------------------------------

    def _create_repo(self, request: RecordedRequest) -> Response:
        body = request.json or {}
        if body.get("type") != "dataset" or not body.get("name"):
            return _detail(422, "repos/create needs type 'dataset' and a name")
        repo = f"{body.get('organization') or 'default'}/{body['name']}"
        with self._lock:
            if repo in self.repos and not body.get("exist_ok"):
                return _detail(409, f"repository {repo} already exists")
            self.repos.add(repo)
        return json_response({"url": f"{self.root_url}/v1/hf/datasets/{repo}"})

    def _commit(self, request: RecordedRequest, namespace: str, name: str) -> Response:
        repo = f"{namespace}/{name}"
        with self._lock:
            if repo not in self.repos:
                return _detail(404, f"repository {repo} not found")
        try:
            lines = [json.loads(line) for line in request.body.decode("utf-8").splitlines() if line.strip()]
            uploads = {
                op["value"]["path"]: base64.b64decode(op["value"]["content"]) for op in lines if op.get("key") == "file"
            }
        except (ValueError, KeyError, TypeError) as exc:
            return _detail(400, f"malformed commit: {exc}")
        with self._lock:
            for path, content in uploads.items():
                self.files[f"{repo}/{path}"] = content
        return json_response({"commitOid": new_id("commit"), "commitUrl": f"{self.root_url}/{repo}"})

    # -- Entity Store ----------------------------------------------------------------

    def _register_dataset(self, request: RecordedRequest) -> Response:
        body = request.json or {}
        if not body.get("name") or not str(body.get("files_url", "")).startswith("hf://datasets/"):
            return _detail(422, "a dataset needs a name and files_url hf://datasets/<namespace>/<name>")
        key = f"{body.get('namespace') or 'default'}/{body['name']}"
        with self._lock:
            if key in self.datasets:
                return _detail(409, f"dataset {key} already exists")
            self.datasets[key] = body
        return json_response({**body, "id": new_id("dataset")})

    def _get_dataset(self, request: RecordedRequest, namespace: str, name: str) -> Response:
        with self._lock:
            found = self.datasets.get(f"{namespace}/{name}")
        return json_response(found) if found else _detail(404, f"dataset {namespace}/{name} not found")

    # -- Customizer ------------------------------------------------------------------

    def _create_job(self, request: RecordedRequest) -> Response:
        body = request.json or {}
        with self._lock:
            if self._creation_failures:
                status, message = self._creation_failures.pop(0)
                return _detail(status, message)
            dataset = body.get("dataset") or {}
            if f"{dataset.get('namespace')}/{dataset.get('name')}" not in self.datasets:
                return _detail(404, f"dataset {dataset} is not registered in the Entity Store")
            if not body.get("config") or (body.get("hyperparameters") or {}).get("training_type") not in ("sft", "dpo"):
                return _detail(422, "a job needs a config and hyperparameters.training_type 'sft' or 'dpo'")
            job = FakeNeMoJob(new_id("cust"), body, list(self.job_script), self.job_error)
            self.jobs[job.id] = job
            return json_response(job.body())

    def _list_jobs(self, request: RecordedRequest) -> Response:
        with self._lock:
            return json_response({"data": [job.body() for job in self.jobs.values()]})

    def _find(self, job_id: str) -> FakeNeMoJob | None:
        with self._lock:
            return self.jobs.get(job_id)

    def _get_job(self, request: RecordedRequest, job_id: str) -> Response:
        job = self._find(job_id)
        return json_response(job.body()) if job else _detail(404, f"job {job_id} not found")

    def _job_status(self, request: RecordedRequest, job_id: str) -> Response:
        job = self._find(job_id)
        if job is None:
            return _detail(404, f"job {job_id} not found")
        with self._lock:
            body = job.body()
            job.advance()
        return json_response(body)

    def _cancel_job(self, request: RecordedRequest, job_id: str) -> Response:
        job = self._find(job_id)
        if job is None:
            return _detail(404, f"job {job_id} not found")
        with self._lock:
            if job.status in ("completed", "failed"):
                return _detail(409, f"job {job_id} is already {job.status}")
            job.cancelled = True
            return json_response(job.body())
