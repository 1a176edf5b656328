"""`TRLAdapter`: DPO on your own machine with TRL's `DPOTrainer` (extra ``opto[trl]``).

It trains a Hugging Face causal LM (a local folder with config, weights and tokenizer, or
a hub id when the machine may download) on a preference file written by
``opto export --format trl-chat`` (conversational, needs a tokenizer with a chat template)
or ``--format trl`` (plain text). The job runs in a background thread, so `submit`
returns at once; `status` and `wait_until_complete` follow it, `cancel` stops it after
the current step. Each job keeps its files in ``output_dir/<job_id>/``: ``job.json`` (its
state, readable from another process), TRL's checkpoints and, on success, the tuned
model in ``model/`` (the job's `fine_tuned_model`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from .._io import atomic_write_text, read_jsonl
from ..preference.schemas import DatasetFormatError, validate_jsonl
from .base import FineTuneError, JobState, TrainerAdapter, TrainingJobRef, TrainingJobStatus, job_id_of

__all__ = ["TRLAdapter"]

logger = logging.getLogger(__name__)

_INSTALL = "TRLAdapter needs the `trl` extra: pip install 'opto[trl]' (it brings trl and torch)"


class _JobState(BaseModel):
    job_id: str
    status: JobState = "pending"
    progress: float | None = 0.0
    message: str = ""
    fine_tuned_model: str | None = None
    error: str | None = None
    started_at: float | None = None
    finished_at: float | None = None


class TRLAdapter(TrainerAdapter):
    """Run DPO locally with TRL on a Hugging Face model.

    Args:
        model_path: a local model folder (or hub id) with its tokenizer.
        output_dir: where each job's folder is made.
        beta: the DPO temperature (how far from the reference model).
        learning_rate, num_train_epochs, max_steps, per_device_train_batch_size,
        gradient_accumulation_steps, max_length, seed: the usual `DPOConfig` settings
            (`max_steps=-1` trains for `num_train_epochs`).
        config: more `DPOConfig` keyword arguments, applied last.
        min_examples: the fewest pairs accepted.

    Without a CUDA device, bf16 and pinned memory are off unless `config` sets them.
    """

    backend = "trl"

    def __init__(
        self,
        model_path: str | Path,
        *,
        output_dir: str | Path,
        beta: float = 0.1,
        learning_rate: float = 5e-6,
        num_train_epochs: float = 1.0,
        max_steps: int = -1,
        per_device_train_batch_size: int = 2,
        gradient_accumulation_steps: int = 1,
        max_length: int | None = 1024,
        seed: int = 0,
        config: Mapping[str, Any] | None = None,
        min_examples: int = 1,
    ) -> None:
        self.model_path = str(model_path)
        self.output_dir = Path(output_dir)
        self.settings: dict[str, Any] = {
            "beta": beta, "learning_rate": learning_rate, "num_train_epochs": num_train_epochs,
            "max_steps": max_steps, "per_device_train_batch_size": per_device_train_batch_size,
            "gradient_accumulation_steps": gradient_accumulation_steps, "max_length": max_length, "seed": seed,
            **dict(config or {}),
        }
        self.min_examples = min_examples
        self._jobs: dict[str, _JobState] = {}
        self._stops: dict[str, threading.Event] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"TRLAdapter({self.model_path!r}, output_dir={str(self.output_dir)!r})"

    # -- protocol --------------------------------------------------------------------

    async def initialize(self) -> None:
        """Check that trl, transformers, datasets and torch import."""
        _require_trl()

    async def is_healthy(self) -> bool:
        """True when TRL imports and the model folder (if local) has a config."""
        try:
            _require_trl()
        except FineTuneError as exc:
            logger.warning("%s", exc)
            return False
        path = Path(self.model_path)
        return not path.exists() or (path / "config.json").is_file()

    async def submit(self, dataset: str | Path | Any, *, validation_dataset: str | Path | None = None,
                     **kwargs: Any) -> TrainingJobRef:
        """Validate the file (trl-chat or trl format) and start training in the background."""
        if kwargs:
            raise TypeError(f"unexpected argument(s) {sorted(kwargs)}")
        if not isinstance(dataset, (str, Path)):
            raise TypeError(f"dataset must be the path of a JSONL file, got {type(dataset).__name__}")
        _require_trl()
        fmt = _detect_format(Path(dataset))
        validate_jsonl(dataset, fmt, min_examples=self.min_examples)
        if validation_dataset is not None:
            validate_jsonl(validation_dataset, _detect_format(Path(validation_dataset)), min_examples=1)
        job_id = f"trl-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        state = _JobState(job_id=job_id, message="queued")
        stop = threading.Event()
        with self._lock:
            self._jobs[job_id] = state
            self._stops[job_id] = stop
        self._save(state)
        thread = threading.Thread(target=self._run, name=f"opto-{job_id}",
                                  args=(state, Path(dataset), validation_dataset, stop))
        self._threads[job_id] = thread
        thread.start()
        return TrainingJobRef(job_id=job_id, backend=self.backend, base_model=self.model_path, method="dpo",
                              training_file=str(dataset),
                              validation_file=str(validation_dataset) if validation_dataset else None)

    async def status(self, ref: TrainingJobRef | str) -> TrainingJobStatus:
        """The job's state (from memory, or from its job.json written by another process)."""
        job_id = job_id_of(ref)
        with self._lock:
            state = self._jobs.get(job_id)
            state = state.model_copy() if state is not None else None
        if state is None:
            path = self.output_dir / job_id / "job.json"
            if not path.is_file():
                raise FineTuneError(f"no TRL job {job_id!r} in {self.output_dir}")
            state = _JobState.model_validate_json(path.read_text(encoding="utf-8"))
        return TrainingJobStatus(job_id=job_id, status=state.status, raw_status=state.status,
                                 progress=state.progress, message=state.message,
                                 fine_tuned_model=state.fine_tuned_model, error=state.error)

    async def cancel(self, ref: TrainingJobRef | str) -> TrainingJobStatus:
        """Stop the job after its current step (only jobs of this process can be cancelled)."""
        job_id = job_id_of(ref)
        stop = self._stops.get(job_id)
        if stop is None:
            raise FineTuneError(f"TRL job {job_id!r} was not started by this adapter; it cannot be cancelled here")
        stop.set()
        self._update(job_id, message="cancelling after the current step")
        return await self.status(job_id)

    def join(self, ref: TrainingJobRef | str, timeout: float | None = None) -> None:
        """Block until the job's thread ends (sync code that has nothing else to do)."""
        thread = self._threads.get(job_id_of(ref))
        if thread is not None:
            thread.join(timeout)

    # -- the training thread ---------------------------------------------------------

    def _update(self, job_id: str, **fields: Any) -> None:
        with self._lock:
            state = self._jobs[job_id]
            for key, value in fields.items():
                setattr(state, key, value)
            snapshot = state.model_copy()
        self._save(snapshot)

    def _save(self, state: _JobState) -> None:
        folder = self.output_dir / state.job_id
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / "job.json", state.model_dump_json(indent=2) + "\n")

    def _run(self, state: _JobState, dataset: Path, validation: str | Path | None, stop: threading.Event) -> None:
        job_id = state.job_id
        self._update(job_id, status="running", started_at=time.time(), message="loading the model")
        try:
            final = self._train(job_id, dataset, validation, stop)
        except Exception as exc:  # the job's failure is reported through status()
            logger.exception("TRL job %s failed", job_id)
            self._update(job_id, status="failed", progress=None, finished_at=time.time(),
                         error=f"{type(exc).__name__}: {exc}", message=f"training failed: {type(exc).__name__}: {exc}")
            return
        if stop.is_set():
            self._update(job_id, status="cancelled", finished_at=time.time(), message="cancelled",
                         fine_tuned_model=None)
        else:
            self._update(job_id, status="succeeded", progress=1.0, finished_at=time.time(),
                         fine_tuned_model=str(final), message=f"fine-tuned model: {final}")

    def _train(self, job_id: str, dataset: Path, validation: str | Path | None, stop: threading.Event) -> Path:
        import torch
        from datasets import Dataset
        from transformers import AutoTokenizer, TrainerCallback
        from trl import DPOConfig, DPOTrainer

        adapter = self

        class Progress(TrainerCallback):  # type: ignore[misc]
            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
                total = state.max_steps or 0
                adapter._update(job_id, progress=(state.global_step / total) if total else None,
                                message=f"step {state.global_step}/{total}")
                if stop.is_set():
                    control.should_training_stop = True
                return control

        folder = self.output_dir / job_id
        settings = dict(self.settings)
        if not torch.cuda.is_available():
            settings.setdefault("bf16", False)
            settings.setdefault("dataloader_pin_memory", False)
        settings.setdefault("report_to", "none")
        settings.setdefault("save_strategy", "no")
        settings.setdefault("logging_steps", 1)
        args = DPOConfig(output_dir=str(folder / "trainer"), **settings)
        tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        train = Dataset.from_list(read_jsonl(dataset))
        evaluation = Dataset.from_list(read_jsonl(validation)) if validation else None
        if isinstance(train[0]["prompt"], list) and not getattr(tokenizer, "chat_template", None):
            raise DatasetFormatError(
                f"{dataset} is conversational (trl-chat) but the tokenizer of {self.model_path} has no chat "
                "template; export with --format trl instead, or give the tokenizer a chat_template"
            )
        trainer = DPOTrainer(model=self.model_path, args=args, train_dataset=train, eval_dataset=evaluation,
                             processing_class=tokenizer, callbacks=[Progress()])
        self._update(job_id, message="training")
        trainer.train()
        final = folder / "model"
        if not stop.is_set():
            trainer.save_model(str(final))
            tokenizer.save_pretrained(str(final))
        return final


def _require_trl() -> None:
    try:
        import datasets  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
        import trl  # noqa: F401
    except ImportError as exc:
        raise FineTuneError(f"{_INSTALL} ({exc})") from None


def _detect_format(path: Path) -> str:
    """trl-chat when the first record's prompt is a message list, else trl."""
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    break
                return "trl-chat" if isinstance(record, dict) and isinstance(record.get("prompt"), list) else "trl"
    return "trl"
