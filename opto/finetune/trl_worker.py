"""The process that trains one TRL job: ``python -m opto.finetune.trl_worker JOB_FOLDER``.

It reads ``settings.json``, reports through ``job.json`` and stops after the current
step when a ``cancel`` file appears. `TRLAdapter.submit` starts it; nothing else should.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from .._io import read_jsonl
from ..preference.schemas import DatasetFormatError
from .job_folder import JobFiles

logger = logging.getLogger("opto.finetune.trl_worker")


def main(folder: str) -> int:
    files = JobFiles(Path(folder))
    job = json.loads(files.settings.read_text(encoding="utf-8"))
    files.update(status="running", started_at=time.time(), message="loading the model")
    try:
        final = train(files, job)
    except BaseException as exc:  # every failure is reported through job.json
        traceback.print_exc()
        files.update(status="failed", progress=None, finished_at=time.time(),
                     error=f"{type(exc).__name__}: {exc}", message=f"training failed: {type(exc).__name__}: {exc}")
        return 1
    if final is None:
        files.update(status="cancelled", finished_at=time.time(), message="cancelled", fine_tuned_model=None)
    else:
        files.update(status="succeeded", progress=1.0, finished_at=time.time(), fine_tuned_model=str(final),
                     message=f"fine-tuned model: {final}")
    return 0


def train(files: JobFiles, job: dict[str, Any]) -> Path | None:
    """Train; returns the saved model's folder, or None when cancelled."""
    if files.cancel.exists():
        return None
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    class Progress(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            total = state.max_steps or 0
            files.update(progress=(state.global_step / total) if total else None,
                         message=f"step {state.global_step}/{total}")
            if files.cancel.exists():
                control.should_training_stop = True
            return control

    settings = dict(job["settings"])
    if not torch.cuda.is_available():
        settings.setdefault("bf16", False)
        settings.setdefault("dataloader_pin_memory", False)
    settings.setdefault("report_to", "none")
    settings.setdefault("save_strategy", "no")
    settings.setdefault("logging_steps", 1)
    args = DPOConfig(output_dir=str(files.folder / "trainer"), **settings)
    tokenizer = AutoTokenizer.from_pretrained(job["model_path"])
    train_set = Dataset.from_list(read_jsonl(job["dataset"]))
    evaluation = Dataset.from_list(read_jsonl(job["validation"])) if job.get("validation") else None
    if isinstance(train_set[0]["prompt"], list) and not getattr(tokenizer, "chat_template", None):
        raise DatasetFormatError(
            f"{job['dataset']} is conversational (trl-chat) but the tokenizer of {job['model_path']} has no chat "
            "template; export with --format trl --tokenizer MODEL instead, or give the tokenizer a chat_template")
    peft_config = None
    if job.get("lora"):
        from peft import LoraConfig

        peft_config = LoraConfig(**job["lora"])
    trainer = DPOTrainer(model=job["model_path"], args=args, train_dataset=train_set, eval_dataset=evaluation,
                         processing_class=tokenizer, callbacks=[Progress()], peft_config=peft_config)
    files.update(message="training")
    trainer.train()
    if files.cancel.exists():
        return None
    trainer.save_model(str(files.model))  # with LoRA: the adapter (adapter_config.json + weights)
    tokenizer.save_pretrained(str(files.model))
    return files.model


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.exit(main(sys.argv[1]))
