"""`opto demo --finetune sft` end to end on the REAL embedded SmolLM2-135M-Instruct: the
prompt stage through llama.cpp, a LoRA SFT job with TRL on the converted model, the tuned
adapter asked zero-shot through `TransformersModel`. Small sizes (the full-size figures
are `bench/weights.py`'s); needs the `local` and `trl` extras, which CI installs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from opto.cli import main
from opto.run.switches import recorded_switches

# the converted embedded model: made once for the whole run (conftest.py)
pytestmark = [pytest.mark.local_model, pytest.mark.trl, pytest.mark.timeout(900),
              pytest.mark.usefixtures("embedded_hf_model")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def test_demo_finetune_sft_distils_the_prompt_stage_into_the_embedded_model(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    code = main(["demo", "--finetune", "sft", "--json", "--no-again", "--run-dir", str(run), "--train", "4",
                 "--validation", "8", "--test", "16", "--collect", "128", "--check", "16"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    report = json.loads(printed)
    zero, prompt, sft = report["stages"]
    assert [zero["stage"], prompt["stage"], sft["stage"]] == ["zero-shot", "prompt", "sft"]
    for stage in report["stages"]:
        assert {"test_accuracy", "test_interval", "prompt_tokens_per_call", "calls", "seconds"} <= set(stage)
        assert stage["test_interval"][0] <= stage["test_accuracy"] <= stage["test_interval"][1]
    assert zero["test_accuracy"] == 0.0  # the embedded model writes a sentence when asked zero-shot
    assert sft["prompt_tokens_per_call"] <= prompt["prompt_tokens_per_call"] and sft["train_records"] > 0
    # The tuned model is a LoRA adapter on the converted embedded model; it was checked against
    # the prompt stage on 16 validation examples, and the run goes on with it unless it is worse.
    assert sft["compared_with"] == "prompt" and sft["validation_change"] is not None
    assert sft["kept"] == (sft["validation_interval"][1] >= 0)
    assert len(recorded_switches(run)) == int(sft["kept"])
    assert len(list((run / "finetune").glob("*/model/adapter_config.json"))) == 1
    # Trained on answers of one word, it now answers with a word too: no sentence.
    assert sft["test_accuracy"] > 0.0
    assert main(["report", str(run)]) == 0 and "stages: zero-shot, prompt, sft" in capsys.readouterr().out
