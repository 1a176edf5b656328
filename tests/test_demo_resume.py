"""`opto demo` stopped and continued, and a run against a server that is not there.

Ctrl-C during step 2 of a real demo on the embedded model, then `--resume`, ends with
the figures of an uninterrupted demo; the messages on the way name the command's own
flag (`--resume`), never the Python argument behind it. A base URL where nothing
listens stops a run, from the command or from `train()`, within seconds and with the
URL in the message. Real subprocesses and real sockets on 127.0.0.1 only.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from opto import Agent, AggregatedUpdate, ExactMatchGuide, OpenAIModel, Optimizer, OptoError, Parameter
from opto.datasets import bigbench

# Small enough to be quick, with two steps so that the resumed run has one left to do.
SIZES = ["--train", "8", "--validation", "8", "--test", "16"]
DEMO = [sys.executable, "-m", "opto.cli", "demo", *SIZES, "--json", "--no-progress"]
SAME = ("test_before", "test_after", "steps", "accepted", "rejected", "final_parameters", "test_change",
        "test_before_interval", "test_after_interval")


def demo(run_dir: Path, *extra: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DEMO, "--run-dir", str(run_dir), *extra], capture_output=True, text=True,
                          timeout=timeout)


def interrupt_after_step_1(run_dir: Path) -> tuple[subprocess.Popen[str], str, str, dict[str, Any]]:
    """Start the demo in `run_dir`, press Ctrl-C as soon as step 1's metrics line is
    written (step 2 is then under way): the process, its stdout and stderr, and that line."""
    process = subprocess.Popen([*DEMO, "--run-dir", str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 600
    try:
        while not (metrics.exists() and metrics.read_text().endswith("\n")):
            assert process.poll() is None, f"the demo ended before step 1 was written: {process.communicate()}"
            assert time.monotonic() < deadline, "step 1 took more than 600 s"
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    first = json.loads(metrics.read_text().splitlines()[0])
    return process, out, err, first


@pytest.mark.local_model
@pytest.mark.timeout(1200)  # about 1 min on 2 idle cores; 15 min seen on a heavily loaded one
def test_a_demo_stopped_with_ctrl_c_and_resumed_ends_as_an_uninterrupted_one(tmp_path: Path) -> None:
    whole = demo(tmp_path / "a")
    assert whole.returncode == 0, whole.stderr
    expected = json.loads(whole.stdout)
    assert expected["steps"] == 2

    process, out, err, step_1 = interrupt_after_step_1(tmp_path / "b")
    assert process.returncode == 130, (out, err)
    assert step_1["step"] == 1
    assert f"opto demo --run-dir {tmp_path / 'b'} --resume" in err, err
    assert "resume=True" not in err and "Traceback" not in err, err
    saved = json.loads((tmp_path / "b" / "checkpoint.json").read_text())
    assert saved["step"] == 1 and not saved["finished"]

    again = demo(tmp_path / "b", timeout=60)  # without --resume: refused, the run left as it is
    assert again.returncode != 0
    assert "--resume" in again.stderr and "resume=True" not in again.stderr, again.stderr
    assert json.loads((tmp_path / "b" / "checkpoint.json").read_text()) == saved

    resumed = demo(tmp_path / "b", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads(resumed.stdout)
    assert {k: report[k] for k in SAME} == {k: expected[k] for k in SAME}
    assert report["final_parameters"]["demos"]  # the run learned something: the comparison is not of empty runs
    assert len((tmp_path / "b" / "ledger.jsonl").read_text().splitlines()) == len(
        (tmp_path / "a" / "ledger.jsonl").read_text().splitlines())

    # The figures match because every sampled call is seeded the same way in both processes:
    # the agent passes seed=0, and the optimizer's and aggregator's unseeded calls take
    # llama.cpp's next seed from the seed of the call before them, which in every step
    # follows the step's own seeded rollouts, never anything the process did earlier.
    # Usage counts what was paid for: the checkpoint written at Ctrl-C keeps the calls the
    # unfinished step 2 had completed, and resume redoes that step, so those calls count
    # twice (none when Ctrl-C came before step 2's first call returned: then all is equal).
    spent = saved["usage"]["SmolLM2-135M-Instruct.Q4_1"]
    extra_calls = spent["calls"] - step_1["calls"]
    extra_tokens = spent["prompt_tokens"] + spent["completion_tokens"] - step_1["tokens"]
    assert extra_calls >= 0 and extra_tokens >= 0
    assert report["calls"] == expected["calls"] + extra_calls
    assert (report["prompt_tokens"] + report["completion_tokens"]
            == expected["prompt_tokens"] + expected["completion_tokens"] + extra_tokens)
    if extra_calls == 0:
        assert (report["prompt_tokens"], report["completion_tokens"]) == (expected["prompt_tokens"],
                                                                          expected["completion_tokens"])


def test_resume_without_a_run_dir_is_refused_in_the_commands_words(tmp_path: Path) -> None:
    done = subprocess.run([*DEMO, "--resume"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "--resume needs --run-dir" in done.stderr and "resume=True" not in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists()  # refused before anything was written


def free_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound, then closed at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_demo_against_an_unreachable_server_stops_soon_and_names_the_url(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "opto.cli", "demo", "--model", "gpt-4o-mini", "--base-url", url, "--train", "4",
         "--validation", "4", "--test", "4", "--no-progress", "--yes", "--run-dir", str(tmp_path / "run")],
        env={**os.environ, "OPENAI_API_KEY": "test-key"}, capture_output=True, text=True, timeout=120,
    )
    seconds = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert seconds < 30, f"{seconds:.1f} s"
    assert f"{url}/chat/completions" in output and "--base-url" in output, output
    assert f"opto demo --run-dir {tmp_path / 'run'} --resume" in done.stderr, done.stderr
    assert "Traceback" not in output
    assert len(output.splitlines()) < 20, output


class Asker(Agent):
    def __init__(self, model: OpenAIModel) -> None:
        self.model = model
        self.prompt = Parameter("Answer the question.", description="system prompt")

    async def forward(self, question: str) -> str:
        reply = await self.model.complete([{"role": "system", "content": self.prompt.value},
                                           {"role": "user", "content": question}])
        return reply.text.strip()


def test_train_against_an_unreachable_server_raises_an_opto_error_naming_the_url(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    model = OpenAIModel("gpt-4o-mini", base_url=url, api_key="k")
    trainer = AggregatedUpdate(Asker(model), Optimizer(model))
    started = time.monotonic()
    try:
        with pytest.raises(OptoError) as raised:
            trainer.train(ExactMatchGuide(), bigbench("plural", split="train", n=4), batch_size=4, progress=False,
                          run_dir=tmp_path / "run")
    finally:
        model.close()
    assert time.monotonic() - started < 30
    message = str(raised.value)
    assert type(raised.value).__name__ == "TooManyFailures"
    assert "4 of 4 rollouts failed" in message and "ConnectionFailedError" in message, message
    assert f"{url}/chat/completions" in message and "base_url" in message, message
    assert "resume=True" in message  # train()'s own words, where a Python argument is right
    assert raised.value.result is not None and raised.value.result.steps == 0
