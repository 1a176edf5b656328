"""`TRLAdapter`: DPO (TRL's `DPOTrainer`) or GRPO on stored groups, on your own machine (extra ``opto-agents[trl]``).

It trains a Hugging Face causal LM (a local folder with config, weights and tokenizer, or
a hub id when the machine may download) on a preference file written by
``opto export --format trl-chat`` (conversational, needs a tokenizer with a chat template)
or ``--format trl --tokenizer MODEL`` (text rendered with the model's template), fully or
with LoRA (peft).

Each job trains in a child process of its own (``python -m opto.finetune.trl_worker``),
so `submit` returns at once, a crash in training cannot take the caller down, and the
job outlives the process that started it. Everything about a job is in its folder
``output_dir/<job_id>/``: ``settings.json`` (what to train), ``job.json`` (its state,
written by the worker), ``process.json`` (the worker's pid), ``cancel`` (a cancel
request), ``train.log``, TRL's files and, on success, the tuned model (or LoRA adapter)
in ``model/``. So `status`, `wait_until_complete` and `cancel` work from any process
that knows `output_dir` and the job id.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import MissingFileError, OptoTypeError, OptoValueError
from ..preference.schemas import validate_jsonl
from .base import FineTuneError, TrainingJobRef
from .job_folder import DEFAULT_LORA
from .worker_jobs import WorkerJobAdapter

__all__ = ["TRLAdapter"]

logger = logging.getLogger(__name__)

_INSTALL = "TRLAdapter needs the `trl` extra: pip install 'opto-agents[trl]' (it brings trl, peft and torch)"


class TRLAdapter(WorkerJobAdapter):
    """Train locally on a Hugging Face model, in a child process per job: DPO with TRL on
    preference pairs, supervised fine-tuning (`method="sft"`) on chosen replies, or GRPO on
    trajectory groups (`method="grpo"`, `opto.finetune.grpo`).

    Args:
        model_path: a local model folder (or hub id) with its tokenizer.
        output_dir: where each job's folder is made.
        method: "dpo" (a trl-chat or trl file), "sft" (an openai-sft file of
            `{"messages": [...]}` records, e.g. `opto export RUN --format openai-sft
            --min-score 1`) or "grpo" (an art file of trajectory groups).
        beta: the DPO temperature (how far from the reference model); for GRPO the KL
            penalty against the starting model (0 turns it off); unused by SFT.
        learning_rate: the optimizer's learning rate.
        num_train_epochs: passes over the data (when `max_steps` is -1).
        max_steps: gradient steps to stop after (-1: train for `num_train_epochs`).
        per_device_train_batch_size: examples (GRPO: replies) per step.
        gradient_accumulation_steps: steps whose gradients are summed before an update.
        max_length: tokens a record is cut to.
        seed: the training seed.
        config: more `DPOConfig` keyword arguments, applied last.
        lora: None trains all weights; True trains a LoRA adapter with opto's defaults
            (r 8, alpha 16, dropout 0.05, all linear layers); a mapping gives
            `peft.LoraConfig` arguments (merged over the defaults).
        min_examples: the fewest pairs accepted.
        cancel_grace: seconds `cancel` waits for the worker to stop after its current
            step before it terminates the process.

    Without a CUDA device, bf16 and pinned memory are off unless `config` sets them.
    """

    backend = "trl"
    worker_module = "opto.finetune.trl_worker"

    def __init__(
        self,
        model_path: str | Path,
        *,
        output_dir: str | Path,
        method: str = "dpo",
        beta: float = 0.1,
        learning_rate: float = 5e-6,
        num_train_epochs: float = 1.0,
        max_steps: int = -1,
        per_device_train_batch_size: int = 2,
        gradient_accumulation_steps: int = 1,
        max_length: int | None = 1024,
        seed: int = 0,
        config: Mapping[str, Any] | None = None,
        lora: bool | Mapping[str, Any] | None = None,
        min_examples: int = 1,
        cancel_grace: float = 10.0,
    ) -> None:
        super().__init__()
        if method not in ("dpo", "sft", "grpo"):
            raise OptoValueError(f"method must be 'dpo', 'sft' or 'grpo', got {method!r}")
        self.model_path = str(model_path)
        self.output_dir = Path(output_dir)
        self.method = method
        self.settings: dict[str, Any] = {
            "beta": beta,
            "learning_rate": learning_rate,
            "num_train_epochs": num_train_epochs,
            "max_steps": max_steps,
            "per_device_train_batch_size": per_device_train_batch_size,
            "gradient_accumulation_steps": gradient_accumulation_steps,
            "max_length": max_length,
            "seed": seed,
            **dict(config or {}),
        }
        if lora is True:
            self.lora: dict[str, Any] | None = dict(DEFAULT_LORA)
        elif isinstance(lora, Mapping):
            self.lora = {**DEFAULT_LORA, **dict(lora)}
        else:
            self.lora = None
        self.min_examples = min_examples
        self.cancel_grace = cancel_grace

    def __repr__(self) -> str:
        return f"TRLAdapter({self.model_path!r}, output_dir={str(self.output_dir)!r})"

    # -- protocol --------------------------------------------------------------------

    async def initialize(self) -> None:
        """Check that trl, transformers, datasets and torch (and peft for LoRA) import."""
        _require_trl(self.lora is not None)

    async def is_healthy(self) -> bool:
        """True when TRL imports and the model folder (if local) has a config."""
        try:
            _require_trl(self.lora is not None)
        except FineTuneError as exc:
            logger.warning("%s", exc)
            return False
        path = Path(self.model_path)
        return not path.exists() or (path / "config.json").is_file()

    async def submit(
        self, dataset: str | Path | Any, *, validation_dataset: str | Path | None = None, **kwargs: Any
    ) -> TrainingJobRef:
        """Validate the file (trl-chat or trl format) and start training in a child process."""
        if kwargs:
            raise OptoTypeError(f"unexpected argument(s) {sorted(kwargs)}")
        if not isinstance(dataset, (str, Path)):
            raise OptoTypeError(f"dataset must be the path of a JSONL file, got {type(dataset).__name__}")
        _require_trl(self.lora is not None)
        fmt = {"grpo": "art", "sft": "openai-sft"}.get(self.method) or _detect_format(Path(dataset))
        validate_jsonl(dataset, fmt, min_examples=self.min_examples)
        if validation_dataset is not None:
            validate_jsonl(validation_dataset, fmt, min_examples=1)
        files = self._new_job(
            {
                "model_path": self.model_path,
                "method": self.method,
                "dataset": str(Path(dataset).resolve()),
                "validation": str(Path(validation_dataset).resolve()) if validation_dataset else None,
                "settings": self.settings,
                "lora": self.lora,
            }
        )
        self._start_worker(files)
        job_id = files.folder.name
        return TrainingJobRef(
            job_id=job_id,
            backend=self.backend,
            base_model=self.model_path,
            method=self.method,
            training_file=str(dataset),
            validation_file=str(validation_dataset) if validation_dataset else None,
        )


def _require_trl(lora: bool = False) -> None:
    import importlib.util

    for module in ("datasets", "torch", "transformers", "trl", *(("peft",) if lora else ())):
        if importlib.util.find_spec(module) is None:
            raise FineTuneError(f"{_INSTALL} (no module named {module!r})")


def _detect_format(path: Path) -> str:
    """trl-chat when the first record's prompt is a message list, else trl."""
    if not path.is_file():
        raise MissingFileError(f"dataset file not found: {path}")
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    break
                return "trl-chat" if isinstance(record, dict) and isinstance(record.get("prompt"), list) else "trl"
    return "trl"
