"""`NeMoCustomizerAdapter`: DPO (or SFT) jobs on NVIDIA NeMo Customizer.

It follows the public v1 API of NeMo Microservices (the 25.x releases documented at
docs.nvidia.com/nemo/microservices):

1. the training (and validation) file is uploaded to the NeMo Data Store, which speaks
   the Hugging Face Hub API: `POST /v1/hf/api/repos/create` makes the dataset repository
   `namespace/name`, and `POST /v1/hf/api/datasets/{namespace}/{name}/commit/main` commits
   `training/data.jsonl` (and `validation/data.jsonl`);
2. the dataset is registered with the Entity Store: `POST /v1/datasets` with
   `files_url="hf://datasets/{namespace}/{name}"`;
3. the job is created: `POST /v1/customization/jobs` with the base model's `config`, the
   `dataset`, `hyperparameters` (`training_type` "dpo" or "sft", `finetuning_type`,
   epochs, batch size, learning rate, and a `dpo` block) and `output_model`;
4. `GET /v1/customization/jobs/{id}/status` is polled, `POST .../cancel` cancels.

Offline it is tested against `opto.testing.FakeNeMoCustomizer`, which implements these
endpoints from the same documentation; it has not been run against a NeMo deployment.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import httpx2 as httpx  # the OpenAI SDK's HTTP client, installed with opto

from .._util.redaction import redact, remember_secret
from ..errors import OptoTypeError, OptoValueError
from ..preference.schemas import validate_jsonl
from .base import (
    FineTuneError,
    FineTuneRefused,
    JobState,
    TrainerAdapter,
    TrainingJobRef,
    TrainingJobStatus,
    error_detail,
    job_id_of,
)

__all__ = ["NeMoCustomizerAdapter"]

logger = logging.getLogger(__name__)

_FILE_FORMAT = {"dpo": "nemo", "sft": "openai-sft"}
# Customizer's job statuses in the common vocabulary ("cancelling" is still under way).
_STATES: dict[str, JobState] = {
    "created": "pending",
    "pending": "pending",
    "unknown": "pending",
    "running": "running",
    "cancelling": "running",
    "completed": "succeeded",
    "failed": "failed",
    "cancelled": "cancelled",
}


class NeMoCustomizerAdapter(TrainerAdapter):
    """Fine-tune on NVIDIA NeMo Customizer.

    Args:
        config: the Customizer configuration of the base model, e.g.
            "meta/llama-3.2-1b-instruct@v1.0.0+A100".
        base_url: the Customizer's root URL (default `NEMO_CUSTOMIZER_URL`).
        data_store_url: the Data Store's root URL (default `NEMO_DATA_STORE_URL`, then
            `base_url`, as behind one NeMo Microservices gateway).
        entity_store_url: the Entity Store's root URL (default `NEMO_ENTITY_STORE_URL`,
            then `base_url`).
        namespace: where datasets and the output model are made.
        method: "dpo" (a file from ``opto export --format nemo``) or "sft"
            (``--format openai-sft``).
        finetuning_type: "all_weights" or "lora".
        hyperparameters: merged into the job's hyperparameters; `beta` becomes DPO's
            `ref_policy_kl_penalty`; e.g. {"epochs": 1, "batch_size": 8, "learning_rate": 5e-6}.
        output_model: the tuned model's name (default `namespace/opto-<random>`).
        api_key: sent as a Bearer token (default `NEMO_API_KEY`, then `NGC_API_KEY`);
            never logged, saved or shown.
        min_examples: the fewest examples accepted.
        timeout: seconds per HTTP request.
    """

    backend = "nemo"
    saved_settings = (
        "config",
        "base_url",
        "data_store_url",
        "entity_store_url",
        "namespace",
        "method",
        "finetuning_type",
        "hyperparameters",
        "output_model",
    )

    def __init__(
        self,
        config: str,
        *,
        base_url: str | None = None,
        data_store_url: str | None = None,
        entity_store_url: str | None = None,
        namespace: str = "default",
        method: Literal["dpo", "sft"] = "dpo",
        finetuning_type: str = "all_weights",
        hyperparameters: Mapping[str, Any] | None = None,
        output_model: str | None = None,
        api_key: str | None = None,
        min_examples: int = 10,
        timeout: float = 60.0,
    ) -> None:
        super().__init__()
        if not config:
            raise OptoValueError(
                "config is required: the Customizer configuration of the base model, "
                "e.g. 'meta/llama-3.2-1b-instruct@v1.0.0+A100'"
            )
        if method not in _FILE_FORMAT:
            raise OptoValueError(f"method must be 'dpo' or 'sft', got {method!r}")
        base_url = base_url or os.environ.get("NEMO_CUSTOMIZER_URL")
        if not base_url:
            raise OptoValueError(
                "NeMoCustomizerAdapter needs the Customizer's URL: pass base_url=... "
                "(--base-url) or set NEMO_CUSTOMIZER_URL"
            )
        self.config = config
        self.base_url = base_url.rstrip("/")
        self.data_store_url = (data_store_url or os.environ.get("NEMO_DATA_STORE_URL") or self.base_url).rstrip("/")
        self.entity_store_url = (entity_store_url or os.environ.get("NEMO_ENTITY_STORE_URL") or self.base_url).rstrip(
            "/"
        )
        self.namespace = namespace
        self.method: Literal["dpo", "sft"] = method
        self.finetuning_type = finetuning_type
        self.hyperparameters = dict(hyperparameters or {})
        self.output_model = output_model
        self.min_examples = min_examples
        self.timeout = timeout
        self._api_key = api_key or os.environ.get("NEMO_API_KEY") or os.environ.get("NGC_API_KEY")
        remember_secret(self._api_key)

    def __repr__(self) -> str:  # the key stays out of every repr and log line
        return f"NeMoCustomizerAdapter({self.config!r}, method={self.method!r}, base_url={self.base_url!r})"

    # -- protocol --------------------------------------------------------------------

    async def initialize(self) -> None:
        """Nothing to prepare: every call opens its own short-lived HTTP client."""

    async def is_healthy(self) -> bool:
        """True when the Customizer answers a job listing with these credentials."""
        try:
            await self._request("GET", f"{self.base_url}/v1/customization/jobs", "list customization jobs")
            return True
        except FineTuneError as exc:
            logger.warning("%s", exc)
            return False

    async def submit(
        self, dataset: str | Path | Any, *, validation_dataset: str | Path | None = None, **kwargs: Any
    ) -> TrainingJobRef:
        """Validate the file(s), upload them, register the dataset and create the job.

        Raises `DatasetFormatError` for a bad file (nothing is sent), `FineTuneRefused`
        when the Customizer refuses the job, `FineTuneError` for other failures.
        """
        if kwargs:
            raise OptoTypeError(f"unexpected argument(s) {sorted(kwargs)}")
        if not isinstance(dataset, (str, Path)):
            raise OptoTypeError(
                f"dataset must be the path of a JSONL file, got {type(dataset).__name__}; "
                "write one with `opto export --format nemo`"
            )
        fmt = _FILE_FORMAT[self.method]
        count = validate_jsonl(dataset, fmt, min_examples=self.min_examples)
        if validation_dataset is not None:
            validate_jsonl(validation_dataset, fmt, min_examples=1)
        name = f"opto-{uuid.uuid4().hex[:12]}"
        files = {"training/data.jsonl": Path(dataset).read_bytes()}
        if validation_dataset is not None:
            files["validation/data.jsonl"] = Path(validation_dataset).read_bytes()
        await self._upload(name, files)
        await self._request(
            "POST",
            f"{self.entity_store_url}/v1/datasets",
            "register the dataset",
            json={
                "name": name,
                "namespace": self.namespace,
                "description": f"opto {self.method} export ({count} examples)",
                "files_url": f"hf://datasets/{self.namespace}/{name}",
            },
        )
        job = await self._request(
            "POST",
            f"{self.base_url}/v1/customization/jobs",
            "create the customization job",
            json=self._job_request(name),
            refusal=True,
        )
        ref = TrainingJobRef(
            job_id=str(job["id"]),
            backend=self.backend,
            base_model=self.config,
            method=self.method,
            training_file=f"{self.namespace}/{name}/training/data.jsonl",
            validation_file=(
                f"{self.namespace}/{name}/validation/data.jsonl" if validation_dataset is not None else None
            ),
        )
        self.jobs.append(ref)
        logger.info(
            "submitted NeMo Customizer %s job %s on %s (%d examples)", self.method, ref.job_id, self.config, count
        )
        return ref

    async def status(self, ref: TrainingJobRef | str) -> TrainingJobStatus:
        """The job's state; `fine_tuned_model` is its output model once it completed."""
        job_id = job_id_of(ref)
        body = await self._request(
            "GET", f"{self.base_url}/v1/customization/jobs/{job_id}/status", f"read job {job_id}"
        )
        raw = str(body.get("status", "unknown"))
        state = _STATES.get(raw, "pending")
        logs = body.get("status_logs") or []
        message = str((logs[-1].get("detail") or logs[-1].get("message") or "") if logs else "")
        done = body.get("percentage_done")
        output = body.get("output_model")
        if state == "succeeded" and not output:  # the status view may leave it out; the job has it
            output = (
                await self._request("GET", f"{self.base_url}/v1/customization/jobs/{job_id}", f"read job {job_id}")
            ).get("output_model")
        return TrainingJobStatus(
            job_id=job_id,
            status=state,
            raw_status=raw,
            progress=None if done is None else max(0.0, min(1.0, float(done) / 100)),
            message=redact(message),
            fine_tuned_model=output if state == "succeeded" else None,
            error=redact(message) if state == "failed" else None,
        )

    async def cancel(self, ref: TrainingJobRef | str) -> TrainingJobStatus:
        """Ask the Customizer to cancel the job; returns its state after the request."""
        job_id = job_id_of(ref)
        await self._request("POST", f"{self.base_url}/v1/customization/jobs/{job_id}/cancel", f"cancel job {job_id}")
        return await self.status(job_id)

    # -- helpers ---------------------------------------------------------------------

    def _job_request(self, dataset_name: str) -> dict[str, Any]:
        settings = dict(self.hyperparameters)
        hyperparameters: dict[str, Any] = {"training_type": self.method, "finetuning_type": self.finetuning_type}
        if self.method == "dpo":
            dpo = dict(settings.pop("dpo", {}))
            if "beta" in settings:
                dpo["ref_policy_kl_penalty"] = settings.pop("beta")
            if dpo:
                hyperparameters["dpo"] = dpo
        hyperparameters.update(settings)
        output = self.output_model or f"{self.namespace}/opto-{uuid.uuid4().hex[:8]}@v1"
        return {
            "config": self.config,
            "dataset": {"name": dataset_name, "namespace": self.namespace},
            "hyperparameters": hyperparameters,
            "output_model": output,
        }

    async def _upload(self, name: str, files: dict[str, bytes]) -> None:
        """Make the dataset repository and commit the files to it (Hugging Face's commit API)."""
        await self._request(
            "POST",
            f"{self.data_store_url}/v1/hf/api/repos/create",
            "create the dataset repository",
            json={"type": "dataset", "name": name, "organization": self.namespace},
        )
        lines = [{"key": "header", "value": {"summary": "opto export", "description": ""}}]
        lines += [
            {
                "key": "file",
                "value": {"path": path, "encoding": "base64", "content": base64.b64encode(content).decode("ascii")},
            }
            for path, content in files.items()
        ]
        await self._request(
            "POST",
            f"{self.data_store_url}/v1/hf/api/datasets/{self.namespace}/{name}/commit/main",
            "upload the dataset files",
            content="\n".join(json.dumps(line) for line in lines),
            headers={"Content-Type": "application/x-ndjson"},
        )

    async def _request(
        self, method: str, url: str, what: str, *, refusal: bool = False, **kwargs: Any
    ) -> dict[str, Any]:
        headers = dict(kwargs.pop("headers", {}))
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        started = time.monotonic()
        try:
            async with httpx.AsyncClient(timeout=self.timeout) as client:
                response = await client.request(method, url, headers=headers, **kwargs)
        except httpx.HTTPError as exc:
            raise FineTuneError(
                f"cannot reach NeMo at {url} to {what}: {redact(str(exc)) or type(exc).__name__} "
                f"(after {time.monotonic() - started:.1f} s); check the URL and that the "
                "service runs"
            ) from None
        if response.status_code >= 400:
            detail = error_detail(response)
            message = f"NeMo refused to {what} ({response.status_code}): {redact(detail)}"
            if refusal and 400 <= response.status_code < 500:
                raise FineTuneRefused(message)
            raise FineTuneError(message)
        try:
            body = response.json()
        except ValueError:
            body = {}
        return body if isinstance(body, dict) else {"data": body}
