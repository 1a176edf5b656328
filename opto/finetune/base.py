"""`TrainerAdapter`: the protocol every fine-tuning backend implements, and its types.

All methods are async. From sync code, run each call with `asyncio.run`::

    adapter = OpenAIFineTuneAdapter("gpt-4.1-mini", method="dpo")
    ref = asyncio.run(adapter.submit("pairs.jsonl"))
    final = asyncio.run(adapter.wait_until_complete(ref, poll_interval=30))

(inside Jupyter, where a loop is already running, `await` them directly).
"""

from __future__ import annotations

import abc
import asyncio
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field
from typing_extensions import Self

from ..errors import OptoError, OptoValueError

__all__ = [
    "AdapterState",
    "JOB_STATES",
    "TERMINAL_STATES",
    "FineTuneError",
    "FineTuneRefused",
    "FineTuneTimeout",
    "JobState",
    "TrainerAdapter",
    "TrainingJobRef",
    "TrainingJobStatus",
]

logger = logging.getLogger(__name__)

JobState = Literal["pending", "running", "succeeded", "failed", "cancelled"]
JOB_STATES: tuple[str, ...] = ("pending", "running", "succeeded", "failed", "cancelled")
TERMINAL_STATES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})


class FineTuneError(OptoError, RuntimeError):
    """A fine-tuning backend failed (upload, job creation, status, ...)."""


class FineTuneRefused(FineTuneError):
    """The backend refused to create the job (no access, model not tunable, service closed)."""


class FineTuneTimeout(FineTuneError, TimeoutError):
    """`wait_until_complete` ran out of time; the job itself may still be running."""


class TrainingJobRef(BaseModel):
    """What `submit` returns: enough to ask about the job later, also from another process."""

    job_id: str
    backend: str
    base_model: str
    method: str
    training_file: str | None = None
    validation_file: str | None = None
    created_at: float = Field(default_factory=time.time)


class TrainingJobStatus(BaseModel):
    """A job's state in the common vocabulary.

    `status` is one of pending, running, succeeded, failed, cancelled; `raw_status` is the
    backend's own word. `progress` is within [0, 1] when the backend says, else None.
    `message` is for people: the error of a failed job, the latest event otherwise.
    `fine_tuned_model` names the result once the job succeeded.
    """

    job_id: str
    status: JobState
    raw_status: str | None = None
    progress: float | None = None
    message: str = ""
    fine_tuned_model: str | None = None
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.status in TERMINAL_STATES

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"


class AdapterState(BaseModel):
    """`TrainerAdapter.state_dict()`: the backend, the settings it was made with and its
    jobs; never a secret."""

    backend: str
    settings: dict[str, Any] = Field(default_factory=dict)
    jobs: list[TrainingJobRef] = Field(default_factory=list)
    last_status: dict[str, TrainingJobStatus] = Field(default_factory=dict)


class TrainerAdapter(abc.ABC):
    """A fine-tuning backend: submit a dataset, follow the job, get the tuned model.

    Subclasses implement `initialize`, `is_healthy`, `submit`, `status` and `cancel`;
    `wait_until_complete` polls `status`. The base owns the job state: `jobs` (every
    submitted job's ref) and `last_status` (the latest status of each), and saves them
    with the settings named in `saved_settings` (`state_dict`, `from_state_dict`), so a
    process can follow jobs another one submitted. Adapters save no secret.
    """

    backend: str = "custom"
    #: The constructor arguments `state_dict` saves (JSON values, never a key or client).
    saved_settings: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self.jobs: list[TrainingJobRef] = []
        self.last_status: dict[str, TrainingJobStatus] = {}

    def state_dict(self) -> dict[str, Any]:
        """The settings and jobs as JSON-ready data (no API key, no client)."""
        if not self.saved_settings:
            raise OptoValueError(
                f"{type(self).__name__} saves no state: list its constructor arguments in saved_settings"
            )
        return AdapterState(
            backend=self.backend,
            settings={name: getattr(self, name) for name in self.saved_settings},
            jobs=self.jobs,
            last_status=self.last_status,
        ).model_dump(mode="json")

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any], *, api_key: str | None = None, **options: Any) -> Self:
        """An adapter restored from `state_dict()`, its jobs included. The key comes from
        `api_key` or the environment; `options` are constructor arguments that were not
        saved (timeouts, retries)."""
        saved = AdapterState.model_validate(state)
        if saved.backend != cls.backend:
            raise OptoValueError(
                f"this state was saved by a {saved.backend!r} adapter, not by {cls.__name__} ({cls.backend!r})"
            )
        keys = {"api_key": api_key} if api_key is not None else {}
        adapter = cls(**saved.settings, **keys, **options)
        adapter.jobs = list(saved.jobs)
        adapter.last_status = dict(saved.last_status)
        return adapter

    @abc.abstractmethod
    async def initialize(self) -> None:
        """Prepare clients or check dependencies; called by `submit` when not yet done."""

    @abc.abstractmethod
    async def is_healthy(self) -> bool:
        """True when the backend answers (credentials and endpoint work); never raises."""

    @abc.abstractmethod
    async def submit(self, dataset: str | Path | Any, **kwargs: Any) -> TrainingJobRef:
        """Validate `dataset` (a JSONL file in the backend's format), start a job, return its ref."""

    @abc.abstractmethod
    async def status(self, ref: TrainingJobRef | str) -> TrainingJobStatus:
        """The job's current state."""

    @abc.abstractmethod
    async def cancel(self, ref: TrainingJobRef | str) -> TrainingJobStatus:
        """Ask the backend to stop the job; returns the state after the request."""

    async def wait_until_complete(
        self, ref: TrainingJobRef | str, poll_interval: float = 10.0, timeout: float | None = None
    ) -> TrainingJobStatus:
        """Poll `status` every `poll_interval` seconds until the job succeeded, failed or was cancelled.

        Returns the final status (check `.status`; a failed job does not raise). Raises
        `FineTuneTimeout` after `timeout` seconds (None waits without limit); the job
        is left running then.
        """
        if poll_interval <= 0:
            raise OptoValueError(f"poll_interval must be > 0 seconds, got {poll_interval}")
        deadline = None if timeout is None else time.monotonic() + timeout
        last: str | None = None
        while True:
            current = await self.status(ref)
            if current.status != last:
                logger.info(
                    "job %s: %s%s", current.job_id, current.status, f" ({current.message})" if current.message else ""
                )
                last = current.status
            if current.done:
                return current
            delay = poll_interval
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise FineTuneTimeout(
                        f"job {current.job_id} is still {current.status} after {timeout} s; it keeps running: "
                        "wait again later or cancel it"
                    )
                delay = min(delay, remaining)
            await asyncio.sleep(delay)


def job_id_of(ref: TrainingJobRef | str) -> str:
    """The job id of a ref or of a bare id string."""
    return ref.job_id if isinstance(ref, TrainingJobRef) else str(ref)


def error_detail(response: Any) -> str:
    """The error text of an HTTP error reply (an `httpx.Response`): FastAPI's "detail", or
    "error" or "message", else the start of the body."""
    import json

    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict):
        for key in ("detail", "error", "message"):
            if body.get(key):
                value = body[key]
                return value if isinstance(value, str) else json.dumps(value)[:500]
    return json.dumps(body)[:500]
