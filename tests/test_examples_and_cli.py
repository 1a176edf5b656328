"""The examples and the `opto` command, run for real against offline models."""

import json
import subprocess
import sys
from pathlib import Path

from opto.cli import main
from opto.ledger import RunDir
from opto.testing import FakeOpenAIServer

ROOT = Path(__file__).resolve().parent.parent


def test_trace_migration_example_runs_and_improves():
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "from_trace.py")],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "accepted: 1" in out
    assert "'system_prompt': 'Reply with digits only.'" in out


def _fake_llm(request):
    """Plays agent, optimizer and aggregator: digits-only prompts make correct counts."""
    system = request["messages"][0]["content"]
    user = request["messages"][-1]["content"]
    if "improve the parameters" in system or "merge several suggested updates" in system:
        return json.dumps({"reasoning": "answer with a number", "suggestion": {"system_prompt": "Reply with digits."}})
    if "digits" in system:
        return str(_count(user))
    return "I am not sure."


_WORDS = {"a": 1, "an": 1, "two": 2, "three": 3, "four": 4, "five": 5}


def _count(question):
    """Sum the quantities in "I have a cat, two dogs, and a fish." (what a good model would do)."""
    listed = question.split("I have ", 1)[1].split(". How many")[0]
    items = [item.strip() for item in listed.replace(", and ", ", ").replace(" and ", ", ").split(",")]
    return sum(_WORDS.get(item.split()[0], 1) for item in items if item)


def test_demo_command_runs_end_to_end_on_an_openai_compatible_server(tmp_path, capsys):
    with FakeOpenAIServer(reply=_fake_llm) as server:
        code = main(["demo", "--model", "fake", "--base-url", server.base_url, "--train", "4", "--validation", "4",
                     "--test", "6", "--run-dir", str(tmp_path / "run"), "--no-progress"])
        requests = len(server.chat_requests)
    out = capsys.readouterr().out
    assert code == 0
    assert "test accuracy before:" in out and "accepted:" in out and "run dir:" in out
    assert requests > 10
    ledger = RunDir(tmp_path / "run").ledger()
    kinds = {r["type"] for r in ledger}
    assert {"rollout", "proposal", "candidate", "decision"} <= kinds
    assert any(r["type"] == "decision" and r.get("accepted") for r in ledger)


def test_command_errors_are_one_clear_line(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoint.json").write_text("{not json")
    with FakeOpenAIServer(reply="x") as server:
        code = main(["demo", "--model", "fake", "--base-url", server.base_url, "--run-dir", str(tmp_path / "run"),
                     "--no-progress"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("opto demo: error:") and "checkpoint" in err
