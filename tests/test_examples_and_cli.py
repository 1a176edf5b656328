"""The examples and the `opto` command, run for real against offline models."""

import asyncio
import io
import json
import re
import os
import subprocess
import zlib
import sys
from pathlib import Path

from opto.cli import main
from opto.datasets import bigbench
from opto.run.ledger import RunDir
from opto.testing import FakeOpenAIServer

ROOT = Path(__file__).resolve().parent.parent


def test_trace_migration_example_runs_and_improves():
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "from_trace.py")],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "accepted: 1" in out
    assert "'system_prompt': 'Reply with digits only.'" in out


def _fake_llm(request):
    """Plays agent, optimizer and aggregator: the agent gives the plural only when shown demos."""
    messages = request["messages"]
    system = messages[0]["content"]
    if "improve the parameters" in system or "merge several suggested updates" in system:
        return json.dumps({"reasoning": "be brief", "suggestion": {"system_prompt": "Reply with one word."}})
    word = messages[-1]["content"].rsplit(" ", 1)[-1]
    if any(m["role"] == "assistant" for m in messages):  # a demo shows the format
        return _PLURALS.get(word, word + "s")
    return f"The plural of {word} is probably {word}s, I think."


_PLURALS = {e.x.rsplit(" ", 1)[-1]: e.info[0] for e in bigbench("plural", split="all")}


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_demo_command_runs_end_to_end_on_an_openai_compatible_server(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", _Terminal("y\n"))  # the answer to "Start the run?"
    with FakeOpenAIServer(reply=_fake_llm) as server:
        code = main(["demo", "--model", "fake", "--base-url", server.base_url, "--train", "4", "--validation", "4",
                     "--test", "6", "--run-dir", str(tmp_path / "run"), "--no-progress"])
        requests = len(server.chat_requests)
    out, err = capsys.readouterr()
    assert code == 0
    assert "Estimated cost of 1 steps" in err and "Start the run? [y/N]" in err
    assert (tmp_path / "run" / "estimate.json").exists()
    assert re.search(r"test accuracy \(6 held-out examples\): before 0\.0% \[0\.0, \d+\.\d\]  "
                     r"after 100\.0% \[\d+\.\d, 100\.0\]", out), out
    assert re.search(r"change: \+100\.0 points, 95% interval \[\+100\.0, \+100\.0\]", out), out
    assert "best constant answer:" in out and "accepted:" in out and "final demos: " in out and "run dir:" in out
    assert requests > 10
    ledger = RunDir(tmp_path / "run").ledger()
    kinds = {r["type"] for r in ledger}
    assert {"rollout", "proposal", "candidate", "decision"} <= kinds
    assert {r["proposer"] for r in ledger if r["type"] == "proposal"} == {"optimizer", "demos"}
    assert any(r["type"] == "decision" and r.get("accepted") for r in ledger)


def test_demo_json_report(tmp_path, capsys):
    with FakeOpenAIServer(reply=_fake_llm) as server:
        code = main(["demo", "--model", "fake", "--base-url", server.base_url, "--train", "4", "--validation", "4",
                     "--test", "6", "--run-dir", str(tmp_path / "run"), "--json", "--selection", "pareto", "--yes"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["test_before"] == 0.0 and report["test_after"] == 1.0
    assert 0 < report["test_baseline"] < 1 and report["test_examples"] == 6
    for key in ("steps", "accepted", "rejected", "calls", "prompt_tokens", "completion_tokens", "seconds"):
        assert isinstance(report[key], (int, float))
    assert report["final_parameters"]["demos"] and report["initial_parameters"]["demos"] == []


def test_command_errors_are_one_clear_line(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoint.json").write_text("{not json")
    with FakeOpenAIServer(reply="x") as server:
        code = main(["demo", "--model", "fake", "--base-url", server.base_url, "--run-dir", str(tmp_path / "run"),
                     "--no-progress", "--yes"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("opto demo: error:") and "checkpoint" in err


def test_demo_on_a_paid_model_without_a_terminal_asks_for_yes_and_sends_nothing_more(tmp_path, capsys):
    with FakeOpenAIServer(reply=_fake_llm) as server:
        code = main(["demo", "--model", "fake", "--base-url", server.base_url, "--train", "4", "--validation", "4",
                     "--test", "6", "--run-dir", str(tmp_path / "run"), "--no-progress"])
        requests = len(server.chat_requests)
    err = capsys.readouterr().err
    assert code == 1 and "pass --yes" in err and "Estimated cost" in err
    assert requests <= 3  # the estimate's sample: 2 rollouts and one proposal, no training step


def _sports_llm(request):
    """Agent, optimizer and aggregator for the custom example; verdicts depend on the prompt."""
    system = request["messages"][0]["content"]
    if "improve the parameters" in system:
        n = request.get("n", 1)
        seed = zlib.crc32(request["messages"][-1]["content"].encode())
        return [json.dumps({"reasoning": "be decisive", "suggestion": {
            "instructions": f"Answer plausible or implausible. Variant {(seed + i) % 7}.", "votes": 1}})
            for i in range(n)]
    if "merge several suggested updates" in system:
        return json.dumps({"reasoning_instructions": "keep one", "suggestion": {
            "instructions": "Answer plausible or implausible. Variant 3.", "votes": 1}})
    statement = request["messages"][-1]["content"]
    verdict = zlib.crc32((system + statement).encode()) % 2
    return ["implausible", "plausible"][verdict]


def test_custom_example_with_two_proposals_exports_pairs_and_finetunes(tmp_path, capsys):
    """Issue 4's path: run examples/ with num_proposals=2, export DPO and TRL, fine-tune, switch."""
    from opto.llm import OpenAIModel
    from opto.preference import PreferencePairBuilder, read_turns, validate_jsonl

    run = tmp_path / "run"
    with FakeOpenAIServer(reply=_sports_llm) as server:
        subprocess.run([sys.executable, str(ROOT / "examples" / "custom_agent.py"), "--model", "fake",
                        "--base-url", server.base_url, "--num-proposals", "2", "--train", "12", "--test", "4",
                        "--run-dir", str(run)], check=True, timeout=300, capture_output=True, env={
                            **os.environ, "OPENAI_API_KEY": "test"})
    assert any(r["type"] == "proposal_score" for r in RunDir(run).ledger())

    dpo, trl = tmp_path / "pairs.jsonl", tmp_path / "pairs.trl.jsonl"
    assert main(["export", str(run), "--source", "all", "--format", "openai-dpo", "--out", str(dpo)]) == 0
    assert main(["export", str(run), "--source", "all", "--format", "trl-chat", "--out", str(trl)]) == 0
    assert validate_jsonl(dpo, "openai-dpo", min_examples=1) >= 1
    pairs = PreferencePairBuilder().build(read_turns(run, "all").turns)
    trl_rows = [json.loads(line) for line in trl.read_text().splitlines()]
    assert len(trl_rows) == len(pairs) > 0
    assert all(p.chosen_score > p.rejected_score for p in pairs)
    assert {(r["chosen"][0]["content"], r["rejected"][0]["content"]) for r in trl_rows} == {
        (p.chosen, p.rejected) for p in pairs}
    # The plain trl format needs the served model's chat template; without one it says where to go.
    capsys.readouterr()
    assert main(["export", str(run), "--format", "trl", "--out", str(tmp_path / "plain.jsonl")]) == 1
    assert "trl-chat" in capsys.readouterr().err and not (tmp_path / "plain.jsonl").exists()

    with FakeOpenAIServer() as server:
        state = tmp_path / "ft-state.json"
        code = main(["finetune", "submit", str(dpo), "--model", "gpt-4.1-mini", "--base-url", server.base_url,
                     "--wait", "--poll-interval", "0.01", "--state", str(state)])
        out = capsys.readouterr().out
        assert code == 0 and "succeeded" in out
        job = next(iter(server.jobs.values()))
        assert job["status"] == "succeeded" and job["method"]["type"] == "dpo"
        assert "test" not in state.read_text()  # the key is never written

        from opto.finetune import OpenAIFineTuneAdapter
        adapter = OpenAIFineTuneAdapter.from_state_dict(json.loads(state.read_text()))
        model = OpenAIModel("gpt-4.1-mini", base_url=server.base_url, api_key="test")
        status = asyncio.run(adapter.status(adapter.jobs[-1]))
        adapter.switch_models(status, model)
        assert model.name == job["fine_tuned_model"]
        model.close()


def test_the_fake_server_command_serves_until_stopped():
    import signal

    import httpx2

    process = subprocess.Popen([sys.executable, "-m", "opto.cli", "fake-server", "--reply", "pong"],
                               stdout=subprocess.PIPE, text=True)
    try:
        first = process.stdout.readline()
        assert first.startswith("FakeOpenAIServer listening on http://127.0.0.1:")
        base_url = first.split(" on ", 1)[1].split(" ", 1)[0]
        reply = httpx2.post(base_url + "/chat/completions", json={"model": "m", "messages": [{"role": "user",
                                                                                              "content": "ping"}]})
        assert reply.json()["choices"][0]["message"]["content"] == "pong"
    finally:
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=20)
    assert process.returncode == 0 and "stopped after 1 requests" in out
