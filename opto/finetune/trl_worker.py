"""The process that trains one TRL job: ``python -m opto.finetune.trl_worker JOB_FOLDER``.

It reads ``settings.json``, reports through ``job.json`` and stops after the current
step when a ``cancel`` file appears. `TRLAdapter.submit` starts it; nothing else should.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from .._util.files import read_jsonl
from ..preference.schemas import DatasetFormatError
from .job_folder import JobFiles

__all__ = ["main", "train", "train_grpo"]

logger = logging.getLogger("opto.finetune.trl_worker")


def main(folder: str) -> int:
    files = JobFiles(Path(folder))
    job = json.loads(files.settings.read_text(encoding="utf-8"))
    files.update(status="running", started_at=time.time(), message="loading the model")
    try:
        final = train_grpo(files, job) if job.get("method") == "grpo" else train(files, job)
    except BaseException as exc:  # every failure is reported through job.json
        traceback.print_exc()
        files.update(
            status="failed",
            progress=None,
            finished_at=time.time(),
            error=f"{type(exc).__name__}: {exc}",
            message=f"training failed: {type(exc).__name__}: {exc}",
        )
        return 1
    if final is None:
        files.update(status="cancelled", finished_at=time.time(), message="cancelled", fine_tuned_model=None)
    else:
        files.update(
            status="succeeded",
            progress=1.0,
            finished_at=time.time(),
            fine_tuned_model=str(final),
            message=f"fine-tuned model: {final}",
        )
    return 0


def train(files: JobFiles, job: dict[str, Any]) -> Path | None:
    """DPO, or SFT (`method="sft"`); returns the saved model's folder, or None when cancelled."""
    if files.cancel.exists():
        return None
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    supervised = job.get("method") == "sft"
    config_class, trainer_class = (SFTConfig, SFTTrainer) if supervised else (DPOConfig, DPOTrainer)

    class Progress(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            total = state.max_steps or 0
            files.update(
                progress=(state.global_step / total) if total else None, message=f"step {state.global_step}/{total}"
            )
            if files.cancel.exists():
                control.should_training_stop = True
            return control

    settings = dict(job["settings"])
    if not torch.cuda.is_available():
        settings.setdefault("bf16", False)
        settings.setdefault("dataloader_pin_memory", False)
        # TRL turns it on by default, to save GPU memory: on the CPU it only recomputes,
        # and made a LoRA step of the embedded model a third slower.
        names = {field.name for field in dataclasses.fields(config_class)}
        checkpointing = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
        settings.setdefault(checkpointing, False)  # "gradient_checkpointing": its older name
    settings.setdefault("report_to", "none")
    settings.setdefault("save_strategy", "no")
    settings.setdefault("logging_steps", 1)
    if supervised:
        settings.pop("beta", None)  # a preference setting
    args = config_class(output_dir=str(files.folder / "trainer"), **settings)
    tokenizer = AutoTokenizer.from_pretrained(job["model_path"])
    train_set = Dataset.from_list(read_jsonl(job["dataset"]))
    evaluation = Dataset.from_list(read_jsonl(job["validation"])) if job.get("validation") else None
    if supervised and not getattr(tokenizer, "chat_template", None):
        raise DatasetFormatError(
            f"{job['dataset']} holds chat messages but the tokenizer of {job['model_path']} "
            "has no chat template to render them; give the tokenizer a chat_template"
        )
    if not supervised and isinstance(train_set[0]["prompt"], list) and not getattr(tokenizer, "chat_template", None):
        raise DatasetFormatError(
            f"{job['dataset']} is conversational (trl-chat) but the tokenizer of {job['model_path']} has no chat "
            "template; export with --format trl --tokenizer MODEL instead, or give the tokenizer a chat_template"
        )
    peft_config = None
    if job.get("lora"):
        from peft import LoraConfig

        peft_config = LoraConfig(**job["lora"])
    trainer = trainer_class(
        model=job["model_path"],
        args=args,  # SFTConfig for SFTTrainer, DPOConfig for DPOTrainer
        train_dataset=train_set,
        eval_dataset=evaluation,
        processing_class=tokenizer,
        callbacks=[Progress()],
        peft_config=peft_config,
    )
    files.update(message="training")
    trainer.train()
    if files.cancel.exists():
        return None
    trainer.save_model(str(files.model))  # with LoRA: the adapter (adapter_config.json + weights)
    tokenizer.save_pretrained(str(files.model))
    return files.model


def train_grpo(files: JobFiles, job: dict[str, Any]) -> Path | None:
    """GRPO on stored trajectory groups (`opto.finetune.grpo`); the saved model's folder, or
    None when cancelled."""
    if files.cancel.exists():
        return None
    import copy
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .grpo import LORA_BASE, completions_of, grpo_loss

    settings = job["settings"]
    torch.manual_seed(int(settings.get("seed", 0)))
    tokenizer = AutoTokenizer.from_pretrained(job["model_path"])
    if not getattr(tokenizer, "chat_template", None):
        raise DatasetFormatError(
            f"the tokenizer of {job['model_path']} has no chat template: GRPO scores each reply under it"
        )
    model = AutoModelForCausalLM.from_pretrained(job["model_path"])
    beta = float(settings.get("beta") or 0.0)
    reference: Any = None
    if job.get("lora"):
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(**job["lora"]))  # a wrapped model
        reference = LORA_BASE if beta > 0 else None  # its base is the reference: no second copy
    elif beta > 0:
        reference = copy.deepcopy(model).eval()
    completions, dropped = completions_of(read_jsonl(job["dataset"]))
    if not completions:
        raise DatasetFormatError(
            f"no group in {job['dataset']} has rewards that vary ({dropped} dropped): GRPO learns nothing from them"
        )
    # Minibatches of replies, each its own backward pass: one graph over every reply would
    # hold all their activations at once (tens of GB for a few hundred replies).
    size = max(1, int(settings.get("per_device_train_batch_size") or 8))
    batches = -(-len(completions) // size)
    steps = int(settings.get("max_steps") or 0)
    steps = steps if steps > 0 else max(1, round(float(settings.get("num_train_epochs", 1.0)) * batches))
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=float(settings["learning_rate"])
    )
    model.train()
    started = f"training on {len(completions)} replies ({dropped} groups dropped: equal rewards)"
    logger.info("grpo: %s", started)
    files.update(message=started)
    shuffle = random.Random(int(settings.get("seed", 0)))
    order: list[int] = []
    for step in range(1, steps + 1):
        if files.cancel.exists():
            return None
        if not order:  # a new epoch, in a new order
            order = list(range(len(completions)))
            shuffle.shuffle(order)
        chosen, order = order[:size], order[size:]
        optimizer.zero_grad()
        loss = grpo_loss(model, tokenizer, [completions[i] for i in chosen], beta=beta, reference=reference)
        loss.backward()
        optimizer.step()
        logger.info("grpo step %d/%d: loss %.4f", step, steps, loss.item())
        files.update(progress=step / steps, message=f"step {step}/{steps}, loss {loss.item():.4f}")
    model.save_pretrained(str(files.model))  # with LoRA: the adapter
    tokenizer.save_pretrained(str(files.model))
    return files.model


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.exit(main(sys.argv[1]))
