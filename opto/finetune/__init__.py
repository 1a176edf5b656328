"""Fine-tuning backends: send preference (or supervised) data to a trainer, get a model.

`TrainerAdapter` is the protocol: `initialize()`, `is_healthy()`, `submit(dataset)`,
`status(ref)`, `cancel(ref)` and `wait_until_complete(ref, poll_interval, timeout)`, all
async. From sync code run each with `asyncio.run(...)`::

    import asyncio
    from opto.finetune import OpenAIFineTuneAdapter, switch_model

    adapter = OpenAIFineTuneAdapter("gpt-4.1-mini-2025-04-14", method="dpo")
    ref = asyncio.run(adapter.submit("pairs.jsonl"))
    final = asyncio.run(adapter.wait_until_complete(ref, poll_interval=30))
    if final.succeeded:
        switch_model(agent, final, run_dir="runs/exp1")   # the agent now uses the tuned model

Backends: `OpenAIFineTuneAdapter` (OpenAI or any OpenAI-compatible endpoint),
`NeMoCustomizerAdapter` (NVIDIA NeMo Customizer), `TRLAdapter` (local DPO with TRL;
needs the ``opto-agents[trl]`` extra) and `ARTAdapter` (GRPO on trajectory
groups through an OpenPipe ART server or W&B's serverless training API).
"""

from .art_adapter import ARTAdapter
from .base import (
    JOB_STATES,
    TERMINAL_STATES,
    AdapterState,
    FineTuneError,
    FineTuneRefused,
    FineTuneTimeout,
    JobState,
    TrainerAdapter,
    TrainingJobRef,
    TrainingJobStatus,
)
from .nemo_adapter import NeMoCustomizerAdapter
from .openai_adapter import OpenAIFineTuneAdapter
from .switch import switch_model
from .trl_adapter import TRLAdapter

__all__ = [
    "ARTAdapter",
    "JOB_STATES",
    "TERMINAL_STATES",
    "FineTuneError",
    "FineTuneRefused",
    "FineTuneTimeout",
    "JobState",
    "NeMoCustomizerAdapter",
    "OpenAIFineTuneAdapter",
    "TRLAdapter",
    "AdapterState",
    "TrainerAdapter",
    "TrainingJobRef",
    "TrainingJobStatus",
    "switch_model",
]
