"""OpenAIFineTuneAdapter: the whole job lifecycle against FakeOpenAIServer, and `opto finetune`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from world import make_run

from opto import OpenAIModel
from opto.cli import main
from opto.finetune import (
    FineTuneError,
    FineTuneRefused,
    FineTuneTimeout,
    OpenAIFineTuneAdapter,
    TrainerAdapter,
    TrainingJobStatus,
)
from opto.preference import DatasetFormatError, export_run
from opto.testing import FakeOpenAIServer

KEY = "sk-test-secret-key-123"


@pytest.fixture(scope="module")
def dpo_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An OpenAI DPO file exported from a real run with num_proposals=2 (18 or more pairs)."""
    folder = tmp_path_factory.mktemp("ft")
    make_run(folder / "run")
    export_run(folder / "run", folder / "pairs.jsonl", source="all", format="openai-dpo")
    return folder / "pairs.jsonl"


@pytest.fixture
def server() -> Any:
    with FakeOpenAIServer(reply="hello") as fake:
        yield fake


def adapter_for(server: FakeOpenAIServer, **kwargs: Any) -> OpenAIFineTuneAdapter:
    return OpenAIFineTuneAdapter("gpt-4o-mini", base_url=server.base_url, api_key=KEY, **kwargs)


async def test_success_uploads_creates_a_dpo_job_and_switches_models(server: FakeOpenAIServer, dpo_file: Path) -> None:
    adapter = adapter_for(server, hyperparameters={"beta": 0.2, "n_epochs": 1}, suffix="opto")
    assert isinstance(adapter, TrainerAdapter)
    await adapter.initialize()
    assert await adapter.is_healthy()
    ref = await adapter.submit(dpo_file)
    [stored] = server.files.values()
    assert stored.purpose == "fine-tune" and stored.content == dpo_file.read_bytes()
    job = server.jobs[ref.job_id]
    assert job["method"] == {"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.2, "n_epochs": 1}}}
    assert job["training_file"] == stored.id == ref.training_file and job["suffix"] == "opto"

    first = await adapter.status(ref)  # validating_files -> queued
    assert (first.status, first.raw_status, first.progress) == ("pending", "queued", 0.0)
    final = await adapter.wait_until_complete(ref, poll_interval=0.01, timeout=10)
    assert final.status == "succeeded" and final.progress == 1.0
    assert final.fine_tuned_model and final.fine_tuned_model.startswith("ft:gpt-4o-mini:opto:")

    agent_model = OpenAIModel("gpt-4o-mini", base_url=server.base_url, api_key=KEY, max_retries=0)
    judge_model = OpenAIModel("gpt-4o-mini", base_url=server.base_url, api_key=KEY, max_retries=0)
    try:
        assert adapter.switch_models(final, agent_model, judge_model) == final.fine_tuned_model
        assert agent_model.name == judge_model.name == final.fine_tuned_model
        await agent_model.complete([{"role": "user", "content": "hi"}])
        assert server.chat_requests[-1]["model"] == final.fine_tuned_model
    finally:
        await agent_model.aclose()
        await judge_model.aclose()
        await adapter.aclose()


async def test_supervised_method_validates_an_sft_file(server: FakeOpenAIServer, dpo_file: Path,
                                                       tmp_path: Path) -> None:
    adapter = adapter_for(server, method="supervised")
    with pytest.raises(DatasetFormatError, match="openai-sft"):
        await adapter.submit(dpo_file)  # a DPO file is not a supervised one
    sft = tmp_path / "sft.jsonl"
    export_run(dpo_file.parent / "run", sft, format="openai-sft")
    ref = await adapter.submit(sft)
    assert server.jobs[ref.job_id]["method"] == {"type": "supervised"}


async def test_failure_reports_the_error_and_the_events(server: FakeOpenAIServer, dpo_file: Path) -> None:
    server.job_script = ["validating_files", "running", "failed"]
    adapter = adapter_for(server)
    ref = await adapter.submit(dpo_file)
    final = await adapter.wait_until_complete(ref, poll_interval=0.01, timeout=10)
    assert final.status == "failed" and final.fine_tuned_model is None and final.progress is None
    assert final.error == final.message
    assert "The training file is not valid (fake failure)." in final.message
    assert "code invalid_training_file" in final.message and "parameter training_file" in final.message
    with pytest.raises(FineTuneError, match="failed, with no fine-tuned model"):
        adapter.switch_models(final, OpenAIModel("gpt-4o-mini", base_url=server.base_url, api_key=KEY))


async def test_cancel(server: FakeOpenAIServer, dpo_file: Path) -> None:
    server.job_script = ["validating_files", "queued", "running", "running", "running", "succeeded"]
    adapter = adapter_for(server)
    ref = await adapter.submit(dpo_file)
    assert (await adapter.status(ref)).status == "pending"
    cancelled = await adapter.cancel(ref)
    assert cancelled.status == "cancelled" and server.jobs[ref.job_id]["status"] == "cancelled"
    assert (await adapter.wait_until_complete(ref, poll_interval=0.01)).status == "cancelled"
    with pytest.raises(FineTuneError, match="cannot cancel .* already cancelled"):
        await adapter.cancel(ref)


async def test_a_refused_create_is_a_clear_error(server: FakeOpenAIServer, dpo_file: Path) -> None:
    server.fail_fine_tuning_create(403, "This organization is not allowed to fine-tune.")
    adapter = adapter_for(server)
    with pytest.raises(FineTuneRefused) as caught:
        await adapter.submit(dpo_file)
    text = str(caught.value)
    assert "refused to create a dpo fine-tuning job for 'gpt-4o-mini' (HTTP 403)" in text
    assert "This organization is not allowed to fine-tune" in text
    assert "2027-01-06" in text and "base_url" in text
    assert server.jobs == {} and KEY not in text


async def test_a_bad_file_is_refused_locally_before_any_upload(server: FakeOpenAIServer, dpo_file: Path,
                                                               tmp_path: Path) -> None:
    few = tmp_path / "few.jsonl"
    few.write_text("".join(dpo_file.read_text().splitlines(keepends=True)[:9]), encoding="utf-8")
    with pytest.raises(DatasetFormatError, match="holds 9 openai-dpo examples; at least 10"):
        await adapter_for(server).submit(few)
    bad = tmp_path / "bad.jsonl"
    lines = dpo_file.read_text().splitlines()
    record = json.loads(lines[3])
    record["preferred_output"][0]["role"] = "user"
    bad.write_text("\n".join([*lines[:3], json.dumps(record), *lines[4:]]) + "\n", encoding="utf-8")
    with pytest.raises(DatasetFormatError, match=r"bad.jsonl:4: .*preferred_output.0.role"):
        await adapter_for(server).submit(bad)
    assert server.files == {} and server.jobs == {}


async def test_unknown_statuses_and_missing_jobs(server: FakeOpenAIServer, dpo_file: Path) -> None:
    server.job_script = ["validating_files", "paused"]
    adapter = adapter_for(server)
    ref = await adapter.submit(dpo_file)
    status = await adapter.status(ref.job_id)
    assert (status.status, status.raw_status) == ("running", "paused")
    with pytest.raises(FineTuneTimeout, match="still running after 0.05 s"):
        await adapter.wait_until_complete(ref, poll_interval=0.01, timeout=0.05)
    with pytest.raises(FineTuneError, match="no fine-tuning job 'ftjob-nope'"):
        await adapter.status("ftjob-nope")


async def test_unreachable_endpoint_is_unhealthy() -> None:
    with FakeOpenAIServer() as fake:
        url = fake.base_url
    adapter = OpenAIFineTuneAdapter("gpt-4o-mini", base_url=url, api_key=KEY, max_retries=0, timeout=2)
    assert await adapter.is_healthy() is False


def test_state_round_trips_without_the_key(server: FakeOpenAIServer, dpo_file: Path, tmp_path: Path) -> None:
    adapter = adapter_for(server, hyperparameters={"beta": 0.1}, seed=7)
    ref = asyncio.run(adapter.submit(dpo_file))  # sync use: one asyncio.run per call
    asyncio.run(adapter.status(ref))
    state = adapter.state_dict()
    text = json.dumps(state)
    assert KEY not in text and "api_key" not in text and KEY not in repr(adapter)
    restored = OpenAIFineTuneAdapter.from_state_dict(json.loads(text), api_key=KEY)
    assert restored.jobs == [ref] and restored.base_url == server.base_url and restored.seed == 7
    assert isinstance(restored.last_status[ref.job_id], TrainingJobStatus)
    final = asyncio.run(restored.wait_until_complete(ref, poll_interval=0.01, timeout=10))
    assert final.status == "succeeded"


def test_settings_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="method must be 'dpo' or 'supervised'"):
        OpenAIFineTuneAdapter("m", method="rl", api_key=KEY)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"unknown supervised hyperparameter\(s\) \['beta'\]"):
        OpenAIFineTuneAdapter("m", method="supervised", hyperparameters={"beta": 0.1}, api_key=KEY)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ValueError, match="needs an API key"):
        OpenAIFineTuneAdapter("m")


# ------------------------------------------------------------------------------ the command line


def test_cli_submit_waits_until_succeeded(server: FakeOpenAIServer, dpo_file: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    state = tmp_path / "adapter.json"
    code = main(["finetune", "submit", str(dpo_file), "--model", "gpt-4o-mini", "--base-url", server.base_url,
                 "--hyperparameter", "beta=0.2", "--hyperparameter", "n_epochs=auto", "--wait",
                 "--poll-interval", "0.01", "--state", str(state)])
    printed = capsys.readouterr().out
    [job] = server.jobs.values()
    assert code == 0 and job["status"] == "succeeded"
    assert job["method"]["dpo"]["hyperparameters"] == {"beta": 0.2, "n_epochs": "auto"}
    assert f"submitted job {job['id']}" in printed and f"fine-tuned model: {job['fine_tuned_model']}" in printed
    saved = json.loads(state.read_text())
    assert saved["jobs"][0]["job_id"] == job["id"] and KEY not in state.read_text()


def test_cli_status_wait_and_cancel(server: FakeOpenAIServer, dpo_file: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    server.job_script = ["validating_files", "queued", "running", "running", "running", "succeeded"]
    base = ["--base-url", server.base_url]
    assert main(["finetune", "submit", str(dpo_file), "--model", "gpt-4o-mini", *base]) == 0
    [job_id] = server.jobs
    assert f"job {job_id}: pending" in capsys.readouterr().out
    assert main(["finetune", "status", job_id, *base]) == 0
    assert main(["finetune", "cancel", job_id, *base]) == 0  # the cancel worked
    assert f"job {job_id}: cancelled" in capsys.readouterr().out
    assert main(["finetune", "wait", job_id, *base, "--poll-interval", "0.01"]) == 1


def test_cli_reports_a_refusal_and_a_failure(server: FakeOpenAIServer, dpo_file: Path,
                                             capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    base = ["--model", "gpt-4o-mini", "--base-url", server.base_url]
    server.fail_fine_tuning_create()
    assert main(["finetune", "submit", str(dpo_file), *base]) == 1
    err = capsys.readouterr().err
    assert "opto finetune: error:" in err and "HTTP 403" in err and "2027-01-06" in err
    server.job_script = ["validating_files", "failed"]
    assert main(["finetune", "submit", str(dpo_file), *base, "--wait", "--poll-interval", "0.01"]) == 1
    assert "failed - The training file is not valid" in capsys.readouterr().out


def test_cli_status_reads_the_state_file_that_submit_saved(server: FakeOpenAIServer, dpo_file: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    state = tmp_path / "ft-state.json"
    assert main(["finetune", "submit", str(dpo_file), "--model", "gpt-4o-mini", "--base-url", server.base_url,
                 "--state", str(state)]) == 0
    [job_id] = server.jobs
    capsys.readouterr()
    # no --base-url: the state file says where the job is (the old CLI accepted --state here and ignored it)
    assert main(["finetune", "status", job_id, "--state", str(state)]) == 0
    assert f"job {job_id}:" in capsys.readouterr().out
    assert main(["finetune", "status", job_id, "--backend", "trl", "--output-dir", str(tmp_path),
                 "--state", str(state)]) == 1
    assert "--state is for the openai and nemo backends" in capsys.readouterr().err
