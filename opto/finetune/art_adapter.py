"""`ARTAdapter`: GRPO on trajectory groups through an OpenPipe ART training server.

It speaks two remote protocols over plain HTTP (httpx2, which the OpenAI SDK brings; openpipe-art itself is not a
dependency: it pins `openai<3` and, in its newest releases, Python >= 3.12):

- ``protocol="art-run"``: the routes of ART's ``art run`` server (0.5.17), the ones NeMo
  Agent Toolkit's `ARTTrainerAdapter` uses: register the model, prepare the backend,
  stream ``/_train_model`` (one JSON line per gradient step), read the trained step;
- ``protocol="serverless"``: W&B's serverless training API, ART's maintained remote path:
  create the model, create a training job, follow its events, list its checkpoints.

The learning rate, the KL penalty (``beta``) and the dev settings (e.g.
``allow_training_without_logprobs``) are sent with every training request. Each job is
followed by a worker process (``python -m opto.finetune.art_worker``) that writes the
job's state to its folder under `output_dir`, so `status` and `cancel` work from any
process. The API key is read from an environment variable (never written to a file, and
redacted from every message); the worker inherits it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import httpx2 as httpx  # the OpenAI SDK's HTTP client, installed with opto

from .._util.files import read_jsonl
from .._util.redaction import remember_secret
from ..errors import OptoTypeError, OptoValueError
from ..preference.schemas import validate_jsonl
from ..preference.trajectories import Trajectory
from .base import FineTuneError, TrainingJobRef
from .worker_jobs import WorkerJobAdapter

__all__ = ["ARTAdapter"]

logger = logging.getLogger(__name__)

PROTOCOLS = ("art-run", "serverless")
_DEFAULT_KEY_ENV = {"art-run": "ART_API_KEY", "serverless": "WANDB_API_KEY"}


class ARTAdapter(WorkerJobAdapter):
    """Train an agent's model with GRPO on exported trajectory groups (``opto export --format art``).

    Args:
        model: the name of the trained model (the LoRA that ART serves).
        base_model: the model it starts from, e.g. "Qwen/Qwen2.5-7B-Instruct".
        base_url: the server's root: `art run`'s address, or W&B's API root.
        protocol: "art-run" or "serverless" (see the module).
        project: the project the model belongs to; `entity` the W&B entity (serverless).
        learning_rate: sent as the training config's `learning_rate`.
        kl_penalty: sent as `beta`, the KL penalty against the base model (None: the server's).
        dev_config: more training settings, sent as ART's `dev_config` (art-run) or inside
            `experimental_config` (serverless), e.g. {"allow_training_without_logprobs": True}.
        api_key_env: the environment variable holding the key (default ART_API_KEY for
            art-run, where it is optional, and WANDB_API_KEY for serverless).
        output_dir: where each job's folder is made.
        poll_interval: seconds between event checks (serverless).
        timeout: seconds for each HTTP request (the training stream has no total limit).
        cancel_grace: seconds `cancel` waits for the worker before terminating it.
        min_groups: the fewest groups accepted.

    After success, `fine_tuned_model` is what agents must call: "<model>@<step>" for
    art-run (the LoRA `art run` serves for that step), the checkpoint's name for serverless.
    """

    backend = "art"
    worker_module = "opto.finetune.art_worker"

    def __init__(
        self,
        model: str,
        *,
        base_model: str,
        base_url: str,
        protocol: Literal["art-run", "serverless"] = "art-run",
        project: str = "opto",
        entity: str | None = None,
        learning_rate: float = 5e-6,
        kl_penalty: float | None = None,
        dev_config: Mapping[str, Any] | None = None,
        api_key_env: str | None = None,
        output_dir: str | Path = "art-jobs",
        poll_interval: float = 2.0,
        timeout: float = 60.0,
        cancel_grace: float = 10.0,
        min_groups: int = 1,
    ) -> None:
        super().__init__()
        if protocol not in PROTOCOLS:
            raise OptoValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        if not model or not base_model:
            raise OptoValueError("ARTAdapter needs model (the trained model's name) and base_model")
        if not base_url:
            raise OptoValueError("ARTAdapter needs base_url: the art run server's address or W&B's API root")
        if not learning_rate > 0:
            raise OptoValueError(f"learning_rate must be > 0, got {learning_rate}")
        self.model = model
        self.base_model = base_model
        self.base_url = base_url.rstrip("/")
        self.protocol = protocol
        self.project = project
        self.entity = entity
        self.config: dict[str, Any] = {
            "learning_rate": learning_rate,
            **({"beta": kl_penalty} if kl_penalty is not None else {}),
        }
        self.dev_config = dict(dev_config or {})
        self.api_key_env = api_key_env or _DEFAULT_KEY_ENV[protocol]
        self.output_dir = Path(output_dir)
        self.poll_interval = poll_interval
        self.timeout = timeout
        self.cancel_grace = cancel_grace
        self.min_groups = min_groups
        remember_secret(os.environ.get(self.api_key_env))

    def __repr__(self) -> str:
        return f"ARTAdapter({self.model!r}, protocol={self.protocol!r}, base_url={self.base_url!r})"

    def _key(self) -> str | None:
        return os.environ.get(self.api_key_env) or None

    async def initialize(self) -> None:
        """Check that the serverless protocol has its key."""
        if self.protocol == "serverless" and not self._key():
            raise FineTuneError(
                f"the serverless protocol needs an API key: set {self.api_key_env} (it is read from "
                "the environment only, never written)"
            )

    async def is_healthy(self) -> bool:
        """art-run: the server's /healthcheck answers; serverless: the key is set and accepted."""
        headers = {"Authorization": f"Bearer {self._key()}"} if self._key() else {}
        path = "/healthcheck" if self.protocol == "art-run" else "/preview/models/opto-health-check/checkpoints"
        try:
            async with httpx.AsyncClient(timeout=self.timeout) as client:
                response = await client.get(self.base_url + path, headers=headers)
        except httpx.HTTPError as exc:
            logger.warning("the ART server at %s does not answer: %s", self.base_url, type(exc).__name__)
            return False
        if self.protocol == "art-run":
            return response.status_code == 200
        return bool(self._key()) and response.status_code not in (401, 403) and response.status_code < 500

    async def submit(self, dataset: str | Path | Any, **kwargs: Any) -> TrainingJobRef:
        """Validate the groups (the "art" format) and start the job's worker."""
        kwargs.pop("validation_dataset", None)  # ART trains on groups only: nothing to validate against
        if kwargs:
            raise OptoTypeError(f"unexpected argument(s) {sorted(kwargs)}")
        if not isinstance(dataset, (str, Path)):
            raise OptoTypeError(f"dataset must be the path of a JSONL file, got {type(dataset).__name__}")
        await self.initialize()
        validate_jsonl(dataset, "art", min_examples=self.min_groups)
        self._check_policy(Path(dataset))
        model_json = {
            "name": self.model,
            "project": self.project,
            "base_model": self.base_model,
            "trainable": True,
            **({"entity": self.entity} if self.entity else {}),
        }
        files = self._new_job(
            {
                "protocol": self.protocol,
                "base_url": self.base_url,
                "model": model_json,
                "dataset": str(Path(dataset).resolve()),
                "config": self.config,
                "dev_config": self.dev_config,
                "api_key_env": self.api_key_env,
                "poll_interval": self.poll_interval,
                "timeout": self.timeout,
            }
        )
        self._start_worker(files)
        return TrainingJobRef(
            job_id=files.folder.name,
            backend=self.backend,
            base_model=self.base_model,
            method="grpo",
            training_file=str(dataset),
        )

    def _check_policy(self, path: Path) -> None:
        """Off-policy groups (no logprobs) train only when the dev settings allow it."""
        trajectories = [Trajectory.model_validate(t) for g in read_jsonl(path) for t in g["trajectories"]]
        off_policy = sum(not t.has_logprobs for t in trajectories)
        if off_policy and not self.dev_config.get("allow_training_without_logprobs"):
            raise FineTuneError(
                f"{off_policy} of {len(trajectories)} trajectories in {path} carry no logprobs: they are off-policy "
                "text, which ART trains on only with dev_config={'allow_training_without_logprobs': True} "
                "(--allow-without-logprobs; in effect advantage-weighted SFT). For on-policy GRPO, collect the "
                "rollouts from the model ART serves with logprobs"
            )
