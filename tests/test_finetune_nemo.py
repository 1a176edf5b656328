"""NeMoCustomizerAdapter against the offline FakeNeMoCustomizer (a real HTTP server on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from world import LevelAgent

from opto import OpenAIModel
from opto.finetune import (
    FineTuneError,
    FineTuneRefused,
    NeMoCustomizerAdapter,
    switch_model,
)
from opto.run.switches import recorded_switches
from opto.preference import DatasetFormatError
from opto.testing import FakeNeMoCustomizer

pytestmark = pytest.mark.timeout(30)

KEY = "nvapi-test-0123456789SECRET"
CONFIG = "meta/llama-3.2-1b-instruct@v1.0.0+A100"


def nemo_file(path: Path, n: int = 10) -> Path:
    rows = [{"prompt": [{"role": "user", "content": f"Is {i} even?"}], "chosen_response": "yes" if i % 2 == 0 else "no",
             "rejected_response": "no" if i % 2 == 0 else "yes"} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def fake():
    with FakeNeMoCustomizer() as server:
        yield server


def adapter_for(server: FakeNeMoCustomizer, **kwargs) -> NeMoCustomizerAdapter:
    kwargs.setdefault("api_key", KEY)
    return NeMoCustomizerAdapter(CONFIG, base_url=server.base_url, **kwargs)


def test_a_dpo_job_uploads_registers_runs_and_names_its_model(fake, tmp_path):
    train, validation = nemo_file(tmp_path / "pairs.jsonl"), nemo_file(tmp_path / "val.jsonl", 2)
    adapter = adapter_for(fake, hyperparameters={"beta": 0.2, "epochs": 1, "learning_rate": 5e-6},
                          output_model="default/tuned@v1")
    ref = asyncio.run(adapter.submit(train, validation_dataset=validation))
    [dataset_key] = fake.datasets
    assert fake.files[f"{dataset_key}/training/data.jsonl"] == train.read_bytes()
    assert fake.files[f"{dataset_key}/validation/data.jsonl"] == validation.read_bytes()
    assert fake.datasets[dataset_key]["files_url"] == f"hf://datasets/{dataset_key}"
    job = fake.jobs[ref.job_id].request
    assert job["config"] == CONFIG and job["output_model"] == "default/tuned@v1"
    assert job["hyperparameters"] == {"training_type": "dpo", "finetuning_type": "all_weights", "epochs": 1,
                                      "learning_rate": 5e-6, "dpo": {"ref_policy_kl_penalty": 0.2}}
    seen = [asyncio.run(adapter.status(ref)).status]
    final = asyncio.run(adapter.wait_until_complete(ref, poll_interval=0.01, timeout=5))
    assert seen == ["pending"] and final.status == "succeeded" and final.raw_status == "completed"
    assert final.fine_tuned_model == "default/tuned@v1" and final.progress == 1.0
    assert all(r.headers.get("authorization") == f"Bearer {KEY}" for r in fake.requests)
    # The agent's model (served by NIM behind an OpenAI-compatible API) now asks for the output model.
    agent = LevelAgent(OpenAIModel("meta/llama-3.2-1b-instruct", base_url="http://127.0.0.1:9/v1"), level=1)
    switch_model(agent, final, run_dir=tmp_path / "run")
    assert agent.model.name == "default/tuned@v1" and recorded_switches(tmp_path / "run")[0].job_id == ref.job_id


def test_sft_sends_the_openai_sft_file_and_training_type(fake, tmp_path):
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"},
                                                     {"role": "assistant", "content": f"a{i}"}]}) + "\n"
                            for i in range(10)))
    ref = asyncio.run(adapter_for(fake, method="sft", finetuning_type="lora").submit(path))
    assert fake.jobs[ref.job_id].request["hyperparameters"] == {"training_type": "sft", "finetuning_type": "lora"}


def test_a_failed_job_reports_its_error(tmp_path):
    with FakeNeMoCustomizer(job_script=["created", "running", "failed"], job_error="out of memory") as fake:
        adapter = adapter_for(fake)
        final = asyncio.run(adapter.wait_until_complete(asyncio.run(adapter.submit(nemo_file(tmp_path / "p.jsonl"))),
                                                        poll_interval=0.01, timeout=5))
    assert final.status == "failed" and final.error == "out of memory" and final.fine_tuned_model is None


def test_a_refused_job_says_why_and_cancel_stops_a_running_one(fake, tmp_path):
    fake.fail_job_creation(422, "config meta/nope not found")
    with pytest.raises(FineTuneRefused, match="config meta/nope not found"):
        asyncio.run(adapter_for(fake).submit(nemo_file(tmp_path / "p.jsonl")))
    adapter = adapter_for(fake)
    ref = asyncio.run(adapter.submit(nemo_file(tmp_path / "p.jsonl")))
    assert asyncio.run(adapter.cancel(ref)).status == "cancelled"


def test_a_bad_file_is_refused_before_anything_is_sent(fake, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "x", "chosen_response": "a"}) + "\n")
    with pytest.raises(DatasetFormatError, match="bad.jsonl:1"):
        asyncio.run(adapter_for(fake).submit(bad))
    with pytest.raises(DatasetFormatError, match="at least 10"):
        asyncio.run(adapter_for(fake).submit(nemo_file(tmp_path / "few.jsonl", 3)))
    assert fake.requests == []


def test_the_key_is_never_in_state_repr_or_errors_even_when_echoed(fake, tmp_path):
    adapter = adapter_for(fake)
    fake.fail_job_creation(401, f"invalid token Bearer {KEY}")
    with pytest.raises(FineTuneRefused) as caught:
        asyncio.run(adapter.submit(nemo_file(tmp_path / "p.jsonl")))
    assert KEY not in str(caught.value) and "[REDACTED]" in str(caught.value)
    assert KEY not in json.dumps(adapter.state_dict()) and KEY not in repr(adapter)


def test_state_round_trip_follows_the_job_from_another_process(fake, tmp_path, monkeypatch):
    adapter = adapter_for(fake)
    ref = asyncio.run(adapter.submit(nemo_file(tmp_path / "p.jsonl")))
    state = json.loads(json.dumps(adapter.state_dict()))
    monkeypatch.setenv("NEMO_API_KEY", KEY)
    restored = NeMoCustomizerAdapter.from_state_dict(state)
    assert restored.jobs == adapter.jobs
    final = asyncio.run(restored.wait_until_complete(ref.job_id, poll_interval=0.01, timeout=5))
    assert final.succeeded


def test_an_unreachable_service_is_a_clear_error_and_not_healthy(tmp_path):
    adapter = NeMoCustomizerAdapter(CONFIG, base_url="http://127.0.0.1:9", timeout=2)
    assert asyncio.run(adapter.is_healthy()) is False
    with pytest.raises(FineTuneError, match="cannot reach NeMo at http://127.0.0.1:9"):
        asyncio.run(adapter.submit(nemo_file(tmp_path / "p.jsonl")))


def test_settings_are_checked(monkeypatch):
    monkeypatch.delenv("NEMO_CUSTOMIZER_URL", raising=False)
    with pytest.raises(ValueError, match="NEMO_CUSTOMIZER_URL"):
        NeMoCustomizerAdapter(CONFIG)
    with pytest.raises(ValueError, match="'dpo' or 'sft'"):
        NeMoCustomizerAdapter(CONFIG, base_url="http://x", method="ppo")


# ------------------------------------------------------------------------------ the command line


def test_cli_submits_to_nemo_and_follows_the_job_from_its_state_file(fake, tmp_path, capsys, monkeypatch):
    from opto.cli import main

    monkeypatch.setenv("NEMO_API_KEY", KEY)
    state = tmp_path / "nemo-state.json"
    code = main(["finetune", "submit", str(nemo_file(tmp_path / "p.jsonl")), "--backend", "nemo",
                 "--base-url", fake.base_url, "--model", CONFIG, "--hyperparameter", "epochs=2", "--state", str(state)])
    out = capsys.readouterr().out
    [job_id] = fake.jobs
    assert code == 0 and f"submitted job {job_id} (nemo, dpo" in out and KEY not in state.read_text()
    assert fake.jobs[job_id].request["hyperparameters"]["epochs"] == 2
    # status, wait and cancel take the state file instead of repeating the options
    assert main(["finetune", "wait", job_id, "--backend", "nemo", "--state", str(state), "--poll-interval", "0.01"]) == 0
    assert "fine-tuned model: default/opto-" in capsys.readouterr().out


def test_cli_cancel_succeeds_and_help_lists_only_what_applies(fake, tmp_path, capsys, monkeypatch):
    from opto.cli import main

    monkeypatch.setenv("NEMO_API_KEY", KEY)
    base = ["--backend", "nemo", "--base-url", fake.base_url]
    assert main(["finetune", "submit", str(nemo_file(tmp_path / "p.jsonl")), "--model", CONFIG, *base]) == 0
    [job_id] = fake.jobs
    assert main(["finetune", "cancel", job_id, *base]) == 0  # a cancel that worked is a success
    assert f"job {job_id}: cancelled" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["finetune", "status", "--help"])
    help_text = capsys.readouterr().out
    assert "--hyperparameter" not in help_text and "--validation-file" not in help_text and "--state" in help_text


def test_cli_key_error_speaks_to_cli_users(tmp_path, capsys, monkeypatch):
    from opto.cli import main

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    assert main(["finetune", "submit", str(nemo_file(tmp_path / "p.jsonl")), "--model", "gpt-4o-mini"]) == 1
    err = capsys.readouterr().err
    assert "set OPENAI_API_KEY" in err and "api_key=" not in err
