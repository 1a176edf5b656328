"""`FakeARTServer`: the two remote training APIs `ARTAdapter` speaks, offline.

One real HTTP server on 127.0.0.1 plays both:

- **art-run** (OpenPipe ART 0.5.17's `art run` server, the routes NeMo Agent Toolkit's
  ART adapter uses): `GET /healthcheck`, `POST /register` (the model's JSON),
  `POST /_prepare_backend_for_training` (answers `[base_url, api_key]` of the served
  model), `POST /_train_model` (body `{model, trajectory_groups, config, dev_config,
  verbose}`; answers a stream of JSON lines, one per gradient step), `POST /_get_step`
  (a bare int), `POST /_delete_checkpoint_files`.
- **serverless** (W&B's training API, ART's maintained remote path): `POST /preview/models`,
  `POST /preview/training-jobs` (`{model_id, trajectory_groups, experimental_config}`),
  `GET /preview/training-jobs/{id}/events?after=N` (events training_started,
  gradient_step, training_ended, training_failed; one more per request) and
  `GET /preview/models/{id}/checkpoints`; every request needs `Authorization: Bearer KEY`.

Scripted: `gradient_steps` per training, `step_delay` between streamed steps (a slow
stream, to cancel), `fail_training(message)` and `refuse_registration(message)`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .fake_openai.http import RecordedRequest, Response, json_response, new_id
from .fake_openai.routed import RoutedServer

__all__ = ["FakeARTServer"]


def _detail(status: int, message: str) -> Response:
    """An error in the shape ART's FastAPI server answers with."""
    return json_response({"detail": message}, status)


@dataclass
class _ServerlessJob:
    id: str
    model_id: str
    request: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)
    shown: int = 0  # how many of `events` the API has revealed so far


class FakeARTServer(RoutedServer):
    """A fake `art run` server and W&B serverless training API on one local port.

    Attributes:
        models: {name: the registered model's JSON} (art-run) and {id: body} (serverless).
        steps: {model name: its latest trained step} (art-run: one step per training call).
        trainings: every training request body (art-run and serverless), in order.
        jobs: {job id: serverless job}.
    """

    def __init__(
        self, *, port: int = 0, gradient_steps: int = 3, step_delay: float = 0.0, api_key: str = "test-key"
    ) -> None:
        self.gradient_steps = gradient_steps
        self.step_delay = step_delay
        self.api_key = api_key
        self.models: dict[str, dict[str, Any]] = {}
        self.steps: dict[str, int] = {}
        self.trainings: list[dict[str, Any]] = []
        self.jobs: dict[str, _ServerlessJob] = {}
        self.deleted: list[dict[str, Any]] = []
        self.streams_closed_early = 0
        self._failure: str | None = None
        self._refusal: str | None = None
        self._init_server(port)

    @property
    def base_url(self) -> str:
        """The root URL of both APIs, e.g. "http://127.0.0.1:54321"."""
        return self.root_url

    def fail_training(self, message: str = "CUDA out of memory (fake)") -> None:
        """Make every training from now on fail with `message`."""
        with self._lock:
            self._failure = message

    def refuse_registration(self, message: str = "base model not supported (fake)") -> None:
        """Answer every registration (art-run) or model creation (serverless) with an error."""
        with self._lock:
            self._refusal = message

    def _routes(self) -> list[tuple[str, str, Callable[..., Response | None]]]:
        return [
            ("GET", r"/healthcheck", lambda request: json_response({"status": "ok"})),
            ("POST", r"/register", self._register),
            ("POST", r"/_prepare_backend_for_training", self._prepare),
            ("POST", r"/_train_model", self._train),
            ("POST", r"/_get_step", self._get_step),
            ("POST", r"/_delete_checkpoint_files", self._delete_checkpoints),
            ("POST", r"/preview/models", self._create_model),
            ("POST", r"/preview/training-jobs", self._create_job),
            ("GET", r"/preview/training-jobs/([^/]+)/events", self._events),
            ("GET", r"/preview/models/([^/]+)/checkpoints", self._checkpoints),
        ]

    # -- art run ---------------------------------------------------------------------

    def _model_of(self, request: RecordedRequest) -> tuple[str | None, Response | None]:
        model = (request.json or {}).get("model")
        name = model.get("name") if isinstance(model, dict) else None
        if not name or name not in self.models:
            return None, _detail(404, f"model {name!r} is not registered: POST /register first")
        return name, None

    def _register(self, request: RecordedRequest) -> Response:
        body = request.json or {}
        with self._lock:
            if self._refusal:
                return _detail(400, self._refusal)
        if not body.get("name") or not body.get("base_model") or not body.get("project"):
            return _detail(422, "a model needs name, project and base_model")
        with self._lock:
            self.models[body["name"]] = body
            self.steps.setdefault(body["name"], 0)
        return json_response(None)

    def _prepare(self, request: RecordedRequest) -> Response:
        name, problem = self._model_of(request)
        return problem or json_response([f"{self.root_url}/v1", "served-model-key"])

    def _train(self, request: RecordedRequest) -> Response:
        name, problem = self._model_of(request)
        if problem:
            return problem
        body = request.json or {}
        if not isinstance(body.get("trajectory_groups"), list) or not body["trajectory_groups"]:
            return _detail(422, "trajectory_groups must be a non-empty list")
        with self._lock:
            self.trainings.append(body)
            failure = self._failure
        if failure:
            return _detail(500, failure)
        return Response(200, b"", content_type="application/x-ndjson", chunks=self._stream(str(name)))

    def _stream(self, name: str) -> Iterator[bytes]:
        for step in range(1, self.gradient_steps + 1):
            if not self._sleep(self.step_delay):
                return
            line = {
                "loss": round(1.0 / step, 4),
                "grad_norm": 0.5,
                "gradient_step": step,
                "num_gradient_steps": self.gradient_steps,
            }
            try:
                yield (json.dumps(line) + "\n").encode()
            except GeneratorExit:
                with self._lock:
                    self.streams_closed_early += 1
                raise
        with self._lock:
            self.steps[name] = self.steps.get(name, 0) + 1

    def _get_step(self, request: RecordedRequest) -> Response:
        name, problem = self._model_of(request)
        if problem:
            return problem
        with self._lock:
            return json_response(self.steps.get(str(name), 0))

    def _delete_checkpoints(self, request: RecordedRequest) -> Response:
        name, problem = self._model_of(request)
        if problem:
            return problem
        with self._lock:
            self.deleted.append(request.json or {})
        return json_response(None)

    # -- serverless ------------------------------------------------------------------

    def _unauthorized(self, request: RecordedRequest) -> Response | None:
        given = request.headers.get("authorization", "")
        if given != f"Bearer {self.api_key}":
            # Like some real services, it echoes what it got: the client must redact it.
            return _detail(401, f"invalid API key provided: {given}")
        return None

    def _create_model(self, request: RecordedRequest) -> Response:
        refused = self._unauthorized(request)
        if refused:
            return refused
        body = request.json or {}
        with self._lock:
            if self._refusal:
                return _detail(400, self._refusal)
        if not body.get("name") or not body.get("project") or not body.get("base_model"):
            return _detail(422, "a model needs name, project and base_model")
        model_id = new_id("model")
        with self._lock:
            self.models[model_id] = body
        return json_response({"id": model_id, **body})

    def _create_job(self, request: RecordedRequest) -> Response:
        refused = self._unauthorized(request)
        if refused:
            return refused
        body = request.json or {}
        with self._lock:
            if body.get("model_id") not in self.models:
                return _detail(404, f"model {body.get('model_id')!r} not found")
            if not isinstance(body.get("trajectory_groups"), list) or not body["trajectory_groups"]:
                return _detail(422, "trajectory_groups must be a non-empty list")
            self.trainings.append(body)
            job = _ServerlessJob(new_id("job"), body["model_id"], body)
            events: list[tuple[str, dict[str, Any]]] = [("training_started", {})]
            for step in range(1, self.gradient_steps + 1):
                events.append(
                    (
                        "gradient_step",
                        {"step": step, "num_gradient_steps": self.gradient_steps, "loss": round(1.0 / step, 4)},
                    )
                )
            events.append(
                ("training_failed", {"error": self._failure}) if self._failure else ("training_ended", {"step": 1})
            )
            job.events = [
                {"id": i + 1, "type": kind, "data": data, "created_at": time.time()}
                for i, (kind, data) in enumerate(events)
            ]
            self.jobs[job.id] = job
        return json_response({"id": job.id, "model_id": job.model_id, "status": "queued"})

    def _events(self, request: RecordedRequest, job_id: str) -> Response:
        refused = self._unauthorized(request)
        if refused:
            return refused
        after = int((parse_qs(urlsplit(request.path).query).get("after") or ["0"])[0])
        with self._lock:
            job = self.jobs.get(job_id)
            if job is None:
                return _detail(404, f"training job {job_id!r} not found")
            job.shown = min(job.shown + 1, len(job.events))  # the job moves on one event per look
            data = [e for e in job.events[: job.shown] if e["id"] > after]
            if job.shown == len(job.events) and job.events[-1]["type"] == "training_ended":
                self.steps[job.model_id] = 1
        return json_response({"data": data, "has_more": False})

    def _checkpoints(self, request: RecordedRequest, model_id: str) -> Response:
        refused = self._unauthorized(request)
        if refused:
            return refused
        with self._lock:
            model = self.models.get(model_id)
            step = self.steps.get(model_id, 0)
        if model is None:
            return _detail(404, f"model {model_id!r} not found")
        name = f"wandb-artifact:///{model.get('entity') or 'fake-entity'}/{model['project']}/{model['name']}"
        return json_response({"data": [{"step": s, "name": f"{name}:step{s}"} for s in range(1, step + 1)]})
