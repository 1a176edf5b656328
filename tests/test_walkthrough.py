"""The docs' walkthrough from prompts to weights, run as written: the shipped example on
the embedded model, the export, and the fine-tuning submits against the offline fakes."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from opto.testing import FakeNeMoCustomizer, FakeOpenAIServer

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.local_model, pytest.mark.walkthrough, pytest.mark.timeout(900)]


def walkthrough_commands() -> list[list[str]]:
    page = (ROOT / "docs" / "guides" / "prompts-to-weights.md").read_text()
    section = page.split("## From prompts to weights", 1)[1].split("**1. Train", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
    return [shlex.split(line) for block in blocks for line in block.strip().splitlines()]


def run(command: list[str], cwd: Path, env: dict[str, str]) -> str:
    program = {"python": [sys.executable], "opto": [sys.executable, "-m", "opto.cli"]}[command[0]]
    done = subprocess.run([*program, *command[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{shlex.join(command)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_readme_walkthrough_runs_as_written_on_the_embedded_model(tmp_path: Path) -> None:
    commands = walkthrough_commands()
    assert [c[:2] for c in commands] == [["python", "examples/custom_agent.py"], ["opto", "export"],
                                         ["opto", "finetune"], ["opto", "export"], ["opto", "finetune"]]
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {**os.environ, "OPENAI_API_KEY": "test-key"}
    run(commands[0], tmp_path, env)
    exported = run(commands[1], tmp_path, env)
    pairs = int(re.search(r"wrote (\d+) openai-dpo records", exported).group(1))
    assert pairs >= 10  # the fine-tuning endpoints ask for at least 10
    with FakeOpenAIServer() as openai_server:
        submitted = run(commands[2], tmp_path, {**env, "OPENAI_BASE_URL": openai_server.base_url})
        [job] = openai_server.jobs.values()
    assert "succeeded" in submitted and job["method"]["type"] == "dpo"
    run(commands[3], tmp_path, env)
    with FakeNeMoCustomizer() as nemo:
        submitted = run(commands[4], tmp_path, {**env, "NEMO_CUSTOMIZER_URL": nemo.base_url})
        [nemo_job] = nemo.jobs.values()
    assert "succeeded" in submitted and nemo_job.request["hyperparameters"]["training_type"] == "dpo"


def rl_walkthrough_commands() -> list[list[str]]:
    section = (ROOT / "docs" / "guides" / "rl.md").read_text().split("**Groups.**", 1)[0]
    [block] = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
    return [shlex.split(line) for line in block.strip().splitlines()]


def test_the_readme_rl_walkthrough_runs_as_written_on_the_embedded_model(tmp_path: Path) -> None:
    from opto.testing import FakeARTServer

    commands = rl_walkthrough_commands()
    assert [c[:2] for c in commands] == [["opto", "demo"], ["opto", "export"], ["opto", "collect"],
                                         ["opto", "export"], ["opto", "finetune"], ["opto", "finetune"]]
    env = dict(os.environ)
    run(commands[0], tmp_path, env)
    exported = run(commands[1], tmp_path, env)
    groups = int(re.search(r"wrote (\d+) art records", exported).group(1))
    assert groups >= 20  # the bar for the demo's own run
    records = [json.loads(line) for line in (tmp_path / "groups.jsonl").read_text().splitlines()]
    assert all(len({t["reward"] for t in r["trajectories"]}) > 1 for r in records)
    run(commands[2], tmp_path, env)
    collected = run(commands[3], tmp_path, env)
    assert int(re.search(r"wrote (\d+) art records", collected).group(1)) > 0
    port = int(re.search(r"127\.0\.0\.1:(\d+)", shlex.join(commands[4])).group(1))
    with FakeARTServer(port=port) as server:
        submitted = run(commands[4], tmp_path, env)
        [training] = server.trainings
    assert "succeeded" in submitted and "plural-agent@1" in submitted
    assert len(training["trajectory_groups"]) == groups
    from test_finetune_trl import build_tiny_model

    texts = [m.get("content") or m.get("message", {}).get("content") or "" for r in records
             for t in r["trajectories"] for m in t["messages_and_choices"]]
    build_tiny_model(tmp_path / "my-model", texts)
    trained = run(commands[5], tmp_path, env)
    assert "succeeded 100%" in trained and (tmp_path / "grpo-jobs").is_dir()
