"""A LoRA adapter merged into its base: the full model a later fine-tuning stage starts from."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..llm.transformers_model import adapter_base

__all__ = ["merge_adapter"]


def merge_adapter(adapter: str | Path, out: str | Path) -> Path:
    """Merge the LoRA adapter in `adapter` into the base model it names and save the
    full model, with the tokenizer, to `out` (made once: an existing `out` is returned
    as it is). The folder appears whole or not at all."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter, out = Path(adapter), Path(out)
    if (out / "config.json").is_file():
        return out
    base = adapter_base(adapter)
    merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(adapter)).merge_and_unload()
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    merged.save_pretrained(partial)
    tokenizer_source = adapter if (adapter / "tokenizer_config.json").is_file() else base
    AutoTokenizer.from_pretrained(str(tokenizer_source)).save_pretrained(partial)
    os.replace(partial, out)
    return out
