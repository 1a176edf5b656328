"""ARTAdapter against FakeARTServer, both protocols: jobs, progress, failures, cancel from
another process, the settings in the request, the key in no file."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from world import LevelAgent

from opto import OpenAIModel
from opto.finetune import ARTAdapter, FineTuneError, switch_model
from opto.testing import FakeARTServer

KEY = "sk-art-secret-4242"


def group(rewards: list[float], with_logprobs: bool = False) -> dict:
    choice = {"finish_reason": "stop", "index": 0, "message": {"role": "assistant", "content": "a"},
              "logprobs": {"content": [{"token": "a", "logprob": -0.1}]} if with_logprobs else None}
    return {"trajectories": [{"messages_and_choices": [{"role": "user", "content": "q"}, choice], "reward": r,
                              "metadata": {"example_id": "e"}} for r in rewards], "exceptions": []}


@pytest.fixture
def groups_file(tmp_path: Path) -> Path:
    path = tmp_path / "groups.jsonl"
    path.write_text("".join(json.dumps(group([1.0, 0.0])) + "\n" for _ in range(3)))
    return path


def adapter(server: FakeARTServer, tmp_path: Path, protocol: str = "art-run", **kwargs) -> ARTAdapter:
    options = {"dev_config": {"allow_training_without_logprobs": True}, "learning_rate": 3e-5, "kl_penalty": 0.02,
               "output_dir": tmp_path / "jobs", "poll_interval": 0.05, "cancel_grace": 1.0, **kwargs}
    return ARTAdapter("agent-lora", base_model="Qwen/Qwen2.5-0.5B-Instruct", base_url=server.base_url,
                      protocol=protocol, **options)


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("WANDB_API_KEY", KEY)
    return KEY


async def run_job(art: ARTAdapter, path: Path):
    ref = await art.submit(path)
    return ref, await art.wait_until_complete(ref, poll_interval=0.05, timeout=60)


def no_key_in(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            assert KEY not in path.read_text(errors="replace"), path


async def test_art_run_trains_and_names_the_served_step(tmp_path, groups_file):
    with FakeARTServer(gradient_steps=3) as server:
        art = adapter(server, tmp_path)
        assert await art.is_healthy()
        ref, final = await run_job(art, groups_file)
        assert final.succeeded and final.fine_tuned_model == "agent-lora@1" and final.progress == 1.0
        agent = LevelAgent(OpenAIModel("agent-lora", base_url=server.base_url), level=1)
        switch_model(agent, final)  # ART serves each step under its own name
        assert agent.model.name == "agent-lora@1" and agent.model.base_url == server.base_url
        [training] = server.trainings
        assert training["config"] == {"learning_rate": 3e-5, "beta": 0.02}  # the settings reach the backend
        assert training["dev_config"] == {"allow_training_without_logprobs": True}
        assert training["model"]["base_model"] == "Qwen/Qwen2.5-0.5B-Instruct"
        assert training["trajectory_groups"] == [group([1.0, 0.0])] * 3
        paths = [r.path for r in server.requests]
        assert paths == ["/healthcheck", "/healthcheck", "/register", "/_prepare_backend_for_training",
                         "/_train_model", "/_get_step"]
        _, again = await run_job(art, groups_file)  # the next training is the next served step
        assert again.fine_tuned_model == "agent-lora@2"
    assert ref.method == "grpo" and ref.backend == "art"


async def test_serverless_trains_follows_events_and_keeps_the_key_out_of_files(tmp_path, groups_file, key):
    with FakeARTServer(gradient_steps=2, api_key=key) as server:
        art = adapter(server, tmp_path, protocol="serverless", project="p", entity="team")
        assert await art.is_healthy()
        ref, final = await run_job(art, groups_file)
        assert final.succeeded, final
        assert final.fine_tuned_model == "wandb-artifact:///team/p/agent-lora:step1"
        [training] = server.trainings
        assert training["experimental_config"] == {"learning_rate": 3e-5, "beta": 0.02,
                                                   "allow_training_without_logprobs": True}
        assert all(r.headers["authorization"] == f"Bearer {key}" for r in server.requests)
    no_key_in(tmp_path / "jobs")


async def test_a_wrong_key_is_refused_and_redacted_everywhere(tmp_path, groups_file, key, monkeypatch):
    with FakeARTServer(api_key="the-right-one") as server:  # the server echoes the key it got
        art = adapter(server, tmp_path, protocol="serverless")
        assert not await art.is_healthy()
        ref, final = await run_job(art, groups_file)
    assert final.status == "failed" and "401" in final.error and KEY not in final.error
    assert "[REDACTED]" in final.error
    no_key_in(tmp_path / "jobs")


@pytest.mark.parametrize("protocol", ["art-run", "serverless"])
async def test_a_failed_training_reports_its_message(tmp_path, groups_file, key, protocol):
    with FakeARTServer(api_key=key) as server:
        server.fail_training("CUDA out of memory on step 2 (fake)")
        _, final = await run_job(adapter(server, tmp_path, protocol=protocol), groups_file)
    assert final.status == "failed" and "CUDA out of memory on step 2 (fake)" in final.error


async def test_a_refused_registration_fails_the_job_with_the_servers_reason(tmp_path, groups_file):
    with FakeARTServer() as server:
        server.refuse_registration("base model not supported (fake)")
        _, final = await run_job(adapter(server, tmp_path), groups_file)
    assert final.status == "failed" and "register the model (400): base model not supported (fake)" in final.error


def test_status_and_cancel_from_another_process(tmp_path, groups_file):
    with FakeARTServer(gradient_steps=50, step_delay=0.2) as server:  # a slow stream
        art = adapter(server, tmp_path, cancel_grace=0.5)
        ref = asyncio.run(art.submit(groups_file))

        def cli(action: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "opto.cli", "finetune", action, ref.job_id, "--backend",
                                   "art", "--output-dir", str(tmp_path / "jobs")], capture_output=True, text=True,
                                  timeout=60)

        while "gradient step" not in asyncio.run(art.status(ref)).message:
            asyncio.run(asyncio.sleep(0.05))
        status = cli("status")
        assert status.returncode == 0 and f"job {ref.job_id}: running" in status.stdout
        assert "gradient step" in status.stdout
        cancelled = cli("cancel")
        assert cancelled.returncode == 0, cancelled.stderr
        assert "cancelled" in cancelled.stdout
        assert asyncio.run(art.status(ref)).status == "cancelled"
        art.join(ref, timeout=10)
        for _ in range(100):  # the server notices the closed stream at its next write
            if server.streams_closed_early:
                break
            asyncio.run(asyncio.sleep(0.05))
        assert server.streams_closed_early == 1 and server.steps["agent-lora"] == 0  # the training stopped


async def test_off_policy_groups_need_the_dev_setting(tmp_path, groups_file):
    with FakeARTServer() as server:
        strict = adapter(server, tmp_path, dev_config={})
        with pytest.raises(FineTuneError, match="carry no logprobs.*allow_training_without_logprobs"):
            await strict.submit(groups_file)
        on_policy = tmp_path / "on.jsonl"
        on_policy.write_text(json.dumps(group([1.0, 0.5], with_logprobs=True)) + "\n")
        _, final = await run_job(strict, on_policy)
        assert final.succeeded


async def test_bad_settings_and_files_are_refused(tmp_path, groups_file, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    with pytest.raises(ValueError, match="protocol must be one of art-run, serverless"):
        ARTAdapter("m", base_model="b", base_url="http://127.0.0.1:1", protocol="grpc")  # type: ignore[arg-type]
    with FakeARTServer() as server:
        with pytest.raises(FineTuneError, match="needs an API key: set WANDB_API_KEY"):
            await adapter(server, tmp_path, protocol="serverless").submit(groups_file)
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps({"trajectories": [{"messages_and_choices": [{"role": "assistant", "content": "a"}],
                                                     "reward": 1}]}) + "\n")
        with pytest.raises(ValueError, match="bad.jsonl:1.*the first message is assistant"):
            await adapter(server, tmp_path).submit(bad)
        assert server.trainings == []
