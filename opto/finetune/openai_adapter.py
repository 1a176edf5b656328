"""`OpenAIFineTuneAdapter`: fine-tuning jobs on OpenAI or any OpenAI-compatible endpoint.

The adapter validates the file locally (schema, roles, at least `min_examples`
examples), uploads it, waits until the file is processed, creates the job with
``method={"type": "dpo" | "supervised", ...}`` and follows it. OpenAI's statuses map to
the common ones: validating_files and queued are *pending*, running is *running*, and
succeeded, failed, cancelled keep their names. A failed job's message is built from
``job.error`` and the job's error events.

OpenAI accepts no new fine-tuning jobs after 2027-01-06 and already refuses many
organisations. Any endpoint that speaks the OpenAI fine-tuning API works the same way
(``base_url=...``), and a refused job creation becomes a `FineTuneRefused` that says so.

Its state (settings and the jobs it submitted, never the API key or the client) goes into
a checkpoint with `state_dict()` and comes back with `from_state_dict`.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import openai

from .._util.redaction import redact
from ..errors import OptoTypeError, OptoValueError
from ..llm.errors import describe_error
from ..llm.openai_model import OpenAIModel, resolve_credentials
from ..preference.schemas import validate_jsonl
from .base import (
    FineTuneError,
    FineTuneRefused,
    JobState,
    TrainerAdapter,
    TrainingJobRef,
    TrainingJobStatus,
    job_id_of,
)

__all__ = ["OpenAIFineTuneAdapter"]

logger = logging.getLogger(__name__)

Method = Literal["dpo", "supervised"]
_FILE_FORMAT = {"dpo": "openai-dpo", "supervised": "openai-sft"}
_HYPERPARAMETERS = {
    "supervised": {"batch_size", "learning_rate_multiplier", "n_epochs"},
    "dpo": {"batch_size", "learning_rate_multiplier", "n_epochs", "beta"},
}
_STATUS: dict[str, JobState] = {
    "validating_files": "pending",
    "queued": "pending",
    "running": "running",
    "succeeded": "succeeded",
    "failed": "failed",
    "cancelled": "cancelled",
}
_STEP = re.compile(r"\bstep\s+(\d+)\s*/\s*(\d+)", re.IGNORECASE)
_SERVICE_NOTE = (
    "OpenAI accepts no new fine-tuning jobs after 2027-01-06 and already refuses many organisations; "
    "any OpenAI-compatible fine-tuning endpoint works: pass base_url=... (opto finetune --base-url)"
)


class OpenAIFineTuneAdapter(TrainerAdapter):
    """Fine-tune a model through the OpenAI fine-tuning API (or a compatible endpoint).

    Args:
        base_model: the model to tune, e.g. "gpt-4.1-mini-2025-04-14".
        method: "dpo" (a preference file, `opto export --format openai-dpo`) or
            "supervised" (`--format openai-sft`).
        hyperparameters: e.g. {"n_epochs": 2, "beta": 0.1}; beta is DPO-only.
        suffix: added to the tuned model's name.
        base_url: the API root; defaults to `OPENAI_BASE_URL`, then OpenAI itself.
        api_key: defaults to `OPENAI_API_KEY` (a placeholder for a custom base_url
            without one). Never logged, never saved.
        seed: the job's seed, for reproducible runs where the backend supports it.
        min_examples: the fewest examples accepted locally (OpenAI needs 10).
        timeout: seconds per HTTP request.
        max_retries: the client's retries of 429, 5xx and connection errors.
        file_poll_interval: seconds between checks of an uploaded file's processing.
        file_timeout: seconds to wait for the file to be processed.
    """

    backend = "openai"
    saved_settings = ("base_model", "method", "hyperparameters", "suffix", "base_url", "seed", "min_examples")

    def __init__(
        self,
        base_model: str,
        *,
        method: Method = "dpo",
        hyperparameters: Mapping[str, Any] | None = None,
        suffix: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        seed: int | None = None,
        min_examples: int = 10,
        timeout: float = 60.0,
        max_retries: int = 2,
        file_poll_interval: float = 1.0,
        file_timeout: float = 600.0,
    ) -> None:
        super().__init__()
        if not base_model:
            raise OptoValueError("base_model is required: the name of the model to fine-tune")
        if method not in _FILE_FORMAT:
            raise OptoValueError(f"method must be 'dpo' or 'supervised', got {method!r}")
        hyperparameters = dict(hyperparameters or {})
        unknown = set(hyperparameters) - _HYPERPARAMETERS[method]
        if unknown:
            raise OptoValueError(
                f"unknown {method} hyperparameter(s) {sorted(unknown)}; use {sorted(_HYPERPARAMETERS[method])}"
            )
        if min_examples < 1:
            raise OptoValueError(f"min_examples must be >= 1, got {min_examples}")
        self.base_model = base_model
        self.method: Method = method
        self.hyperparameters = hyperparameters
        self.suffix = suffix
        self.seed = seed
        self.min_examples = min_examples
        self.timeout = timeout
        self.max_retries = max_retries
        self.file_poll_interval = file_poll_interval
        self.file_timeout = file_timeout
        self.base_url, self._api_key = resolve_credentials(base_url, api_key, "OpenAIFineTuneAdapter")
        self._client: openai.AsyncOpenAI | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:  # the key stays out of every repr and log line
        return f"OpenAIFineTuneAdapter({self.base_model!r}, method={self.method!r}, base_url={self.base_url!r})"

    @property
    def endpoint(self) -> str:
        """The API root in messages: the base_url, or "OpenAI"."""
        return self.base_url or "OpenAI"

    # -- client ----------------------------------------------------------------------

    async def initialize(self) -> None:
        """Create the HTTP client for the running event loop."""
        self._ensure_client()

    def _ensure_client(self) -> openai.AsyncOpenAI:
        # An async client belongs to the loop it was used on; `asyncio.run` per call (sync
        # use) makes a new loop each time, so the client follows the loop.
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client = openai.AsyncOpenAI(
                api_key=self._api_key, base_url=self.base_url, timeout=self.timeout, max_retries=self.max_retries
            )
            self._client_loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP client."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def is_healthy(self) -> bool:
        """True when the endpoint answers a fine-tuning request with these credentials."""
        try:
            await self._ensure_client().fine_tuning.jobs.list(limit=1)
            return True
        except openai.APIError as exc:
            logger.warning("%s is not usable for fine-tuning: %s", self.endpoint, describe_error(exc, _message(exc)))
            return False

    # -- submit ----------------------------------------------------------------------

    def validate_file(self, path: str | Path) -> int:
        """Check a file against this method's format locally; returns its number of examples."""
        return validate_jsonl(path, _FILE_FORMAT[self.method], min_examples=self.min_examples)

    async def submit(
        self, dataset: str | Path | Any, *, validation_dataset: str | Path | None = None, **kwargs: Any
    ) -> TrainingJobRef:
        """Validate, upload and start a job on `dataset` (a JSONL file); returns its ref.

        Raises `DatasetFormatError` for a bad file (nothing is uploaded),
        `FineTuneRefused` when the endpoint refuses the job and `FineTuneError` for other
        failures.
        """
        if kwargs:
            raise OptoTypeError(f"unexpected argument(s) {sorted(kwargs)}")
        if not isinstance(dataset, (str, Path)):
            raise OptoTypeError(
                f"dataset must be the path of a JSONL file, got {type(dataset).__name__}; "
                "write one with `opto export` or opto.preference.export_run"
            )
        count = self.validate_file(dataset)
        if validation_dataset is not None:
            validate_jsonl(validation_dataset, _FILE_FORMAT[self.method], min_examples=1)
        client = self._ensure_client()
        training_id = await self._upload(client, Path(dataset))
        validation_id = await self._upload(client, Path(validation_dataset)) if validation_dataset else None
        method: dict[str, Any] = {"type": self.method}
        if self.hyperparameters:
            method[self.method] = {"hyperparameters": dict(self.hyperparameters)}
        params: dict[str, Any] = {"model": self.base_model, "training_file": training_id, "method": method}
        if validation_id:
            params["validation_file"] = validation_id
        if self.suffix:
            params["suffix"] = self.suffix
        if self.seed is not None:
            params["seed"] = self.seed
        try:
            job = await client.fine_tuning.jobs.create(**params)
        except openai.APIStatusError as exc:
            raise FineTuneRefused(self._refusal(exc)) from None
        except openai.APIConnectionError as exc:
            raise FineTuneError(
                f"cannot reach {self.endpoint} to create the fine-tuning job: {redact(str(exc))}"
            ) from None
        ref = TrainingJobRef(
            job_id=job.id,
            backend=self.backend,
            base_model=self.base_model,
            method=self.method,
            training_file=training_id,
            validation_file=validation_id,
        )
        self.jobs.append(ref)
        logger.info("submitted %s job %s on %s (%d examples)", self.method, job.id, self.base_model, count)
        return ref

    async def _upload(self, client: openai.AsyncOpenAI, path: Path) -> str:
        try:
            uploaded = await client.files.create(file=(path.name, path.read_bytes()), purpose="fine-tune")
        except openai.APIStatusError as exc:
            raise FineTuneError(
                f"{self.endpoint} refused the upload of {path}: {describe_error(exc, _message(exc))}"
            ) from None
        except openai.APIConnectionError as exc:
            raise FineTuneError(f"cannot reach {self.endpoint} to upload {path}: {redact(str(exc))}") from None
        deadline = time.monotonic() + self.file_timeout
        current = uploaded
        while getattr(current, "status", None) not in (None, "processed"):
            if current.status == "error":
                details = getattr(current, "status_details", None) or "no details given"
                raise FineTuneError(f"{self.endpoint} could not process {path} (file {current.id}): {details}")
            if time.monotonic() > deadline:
                raise FineTuneError(
                    f"file {current.id} ({path}) is still {current.status!r} after "
                    f"{self.file_timeout} s; try again later"
                )
            await asyncio.sleep(self.file_poll_interval)
            current = await client.files.retrieve(uploaded.id)
        return uploaded.id

    def _refusal(self, exc: openai.APIStatusError) -> str:
        what = (
            f"{self.endpoint} refused to create a {self.method} fine-tuning job for {self.base_model!r} "
            f"(HTTP {exc.status_code}): {_message(exc).rstrip('. ')}"
        )
        if exc.status_code in (401, 403):
            return f"{what}. This key or organisation may not fine-tune there. {_SERVICE_NOTE}"
        if exc.status_code == 404:
            return (
                f"{what}. The endpoint has no fine-tuning API, or does not know the model; "
                f"check base_url and the model name. {_SERVICE_NOTE}"
            )
        return f"{what}. Check the base model, the method and the hyperparameters. {_SERVICE_NOTE}"

    # -- follow ----------------------------------------------------------------------

    async def status(self, ref: TrainingJobRef | str) -> TrainingJobStatus:
        """The job's state, with a readable message (the error of a failed job)."""
        client = self._ensure_client()
        job_id = job_id_of(ref)
        try:
            job = await client.fine_tuning.jobs.retrieve(job_id)
        except openai.NotFoundError:
            raise FineTuneError(f"{self.endpoint} has no fine-tuning job {job_id!r}") from None
        except openai.APIError as exc:
            raise FineTuneError(
                f"cannot get the status of job {job_id} from {self.endpoint}: {describe_error(exc, _message(exc))}"
            ) from None
        events = await self._events(client, job_id)
        result = self._to_status(job, events)
        self.last_status[job_id] = result
        return result

    async def cancel(self, ref: TrainingJobRef | str) -> TrainingJobStatus:
        """Cancel the job (an error if it already finished)."""
        client = self._ensure_client()
        job_id = job_id_of(ref)
        try:
            await client.fine_tuning.jobs.cancel(job_id)
        except openai.APIError as exc:
            raise FineTuneError(
                f"cannot cancel job {job_id} on {self.endpoint}: {describe_error(exc, _message(exc))}"
            ) from None
        return await self.status(job_id)

    async def _events(self, client: openai.AsyncOpenAI, job_id: str) -> list[Any]:
        """The job's latest events, newest first; [] when the endpoint has none."""
        try:
            page = await client.fine_tuning.jobs.list_events(job_id, limit=20)
        except openai.APIError as exc:
            logger.debug("no events for %s: %s", job_id, describe_error(exc, _message(exc)))
            return []
        return list(page.data)

    def _to_status(self, job: Any, events: Sequence[Any]) -> TrainingJobStatus:
        raw = str(job.status)
        status: JobState = _STATUS.get(raw, "running")
        if raw not in _STATUS:
            logger.warning("job %s has status %r, unknown to opto; taken as running", job.id, raw)
        error = _job_error(job, events) if status == "failed" else None
        if status == "failed":
            message = error or "the job failed without saying why"
        elif status == "succeeded":
            message = f"fine-tuned model: {job.fine_tuned_model}"
        elif events:
            message = str(getattr(events[0], "message", ""))
        else:
            message = raw
        return TrainingJobStatus(
            job_id=job.id,
            status=status,
            raw_status=raw,
            progress=_progress(status, events),
            message=message,
            fine_tuned_model=job.fine_tuned_model,
            error=error,
        )

    # -- use the result --------------------------------------------------------------

    def switch_models(self, result: TrainingJobStatus, *models: OpenAIModel) -> str:
        """Point `models` (OpenAIModels that share the base model) at the fine-tuned model.

        Returns the fine-tuned model's name. Raises `FineTuneError` unless the job
        succeeded with a model name.
        """
        if not result.succeeded or not result.fine_tuned_model:
            raise FineTuneError(
                f"job {result.job_id} is {result.status}, with no fine-tuned model to switch to"
                + (f": {result.message}" if result.message else "")
            )
        for model in models:
            if not isinstance(model, OpenAIModel):
                raise OptoTypeError(
                    f"only OpenAIModel can be switched to a fine-tuned model, got {type(model).__name__}"
                )
            if model.name != self.base_model:
                logger.warning("switching %r, which does not use the job's base model %r", model, self.base_model)
            if _root(model.base_url) != _root(self.base_url):
                logger.warning(
                    "%r talks to %s, but the model was tuned on %s", model, model.base_url or "OpenAI", self.endpoint
                )
            model.name = result.fine_tuned_model
        logger.info("switched %d model(s) to %s", len(models), result.fine_tuned_model)
        return result.fine_tuned_model


def _root(url: str | None) -> str:
    return (url or "").rstrip("/")


def _message(exc: openai.APIError) -> str:
    """The server's error message, with any API key it echoed redacted."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return redact(str(inner["message"]))
    return redact(str(getattr(exc, "message", None) or exc))


def _job_error(job: Any, events: Sequence[Any]) -> str:
    """A failed job's error: job.error (message, code, param) and its error events."""
    parts = []
    error = getattr(job, "error", None)
    if error is not None:
        message = getattr(error, "message", None) or ""
        extras = [
            f"code {error.code}" if getattr(error, "code", None) else "",
            f"parameter {error.param}" if getattr(error, "param", None) else "",
        ]
        extras = [e for e in extras if e]
        parts.append(message + (f" ({', '.join(extras)})" if extras else ""))
    for event in events:
        text = str(getattr(event, "message", ""))
        if getattr(event, "level", "") == "error" and text and not any(text in p for p in parts):
            parts.append(text)
    return "; ".join(p for p in parts if p)


def _progress(status: JobState, events: Sequence[Any]) -> float | None:
    """0 while pending, 1 when finished well; while running, from "Step i/n" events."""
    if status == "pending":
        return 0.0
    if status == "succeeded":
        return 1.0
    if status != "running":
        return None
    for event in events:  # newest first
        data = getattr(event, "data", None)
        if isinstance(data, dict) and data.get("step") and data.get("total_steps"):
            return min(1.0, float(data["step"]) / float(data["total_steps"]))
        match = _STEP.search(str(getattr(event, "message", "")))
        if match and int(match.group(2)):
            return min(1.0, int(match.group(1)) / int(match.group(2)))
    return None
