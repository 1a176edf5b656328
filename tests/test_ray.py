"""`RayExecutor` on a real Ray instance (2 CPUs, started once for the module).

The executor's logic is tested against the fake cluster (`test_executors.py`); these
tests check what only Ray can show: the same ledger from real worker processes, a worker
SIGKILLed mid-rollout, a hung sync agent, one rate limit and one budget across
processes. The test modules travel by value (workers cannot import them).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import openai
import pytest

import test_executors
import world
from opto import Agent, AsyncioExecutor, Budget, ExactMatchGuide, Example, OpenAIModel, Parameter
from opto.llm.errors import BudgetExceeded
from opto.llm.instrument import instrument
from opto.llm.usage import meter_usage
from opto.testing import FakeOpenAIServer
from test_executors import counting_run, examples
from world import ledger_of, timeless

ray = pytest.importorskip("ray", reason="the `ray` extra is part of the test install")
from opto.executors import RayExecutor  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]  # one Ray instance on the machine at a time

for module in (world, test_executors, sys.modules[__name__]):
    cloudpickle.register_pickle_by_value(module)


@pytest.fixture(scope="module", autouse=True)
def ray_instance():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 1024 * 1024, log_to_driver=False)
    yield
    ray.shutdown()  # this instance only: never `ray stop`, which ends every Ray process on the machine


def test_a_run_on_ray_writes_the_same_ledger_as_in_one_process(tmp_path):
    expected = counting_run(tmp_path / "asyncio")
    executor = RayExecutor()
    got = counting_run(tmp_path / "ray", executor)
    executor.close()
    assert ledger_of(tmp_path / "ray") == ledger_of(tmp_path / "asyncio")
    assert got["usage"] == expected["usage"]


class KilledOnce(world.Counter):
    """Kills its own worker process (SIGKILL) the first time it sees the victim example."""

    marker = ""
    victim = 3  # the example with this many apples

    async def forward(self, question: str) -> str:
        if question.count("apple") == self.victim and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return await super().forward(question)


def test_a_worker_sigkilled_mid_rollout_is_retried_with_one_ledger_record(tmp_path, caplog):
    counting_run(tmp_path / "asyncio")
    KilledOnce.marker = str(tmp_path / "killed")
    KilledOnce.victim = random.randint(1, 8)  # any rollout: the ledger must not depend on which
    executor = RayExecutor()
    with caplog.at_level(logging.WARNING, logger="opto.executors"):
        counting_run(tmp_path / "ray", executor, agent_class=KilledOnce)
    executor.close()
    assert Path(KilledOnce.marker).exists()
    assert ledger_of(tmp_path / "ray") == ledger_of(tmp_path / "asyncio")
    lost = [r.getMessage() for r in caplog.records if "lost its worker" in r.getMessage()]
    assert len(lost) == 1 and f"on q{KilledOnce.victim}:" in lost[0] and "attempt 1/3" in lost[0]


class Sleeper(Agent):
    """A sync agent that never returns on "hang" (no timeout inside the worker can stop it)."""

    def __init__(self) -> None:
        self.p = Parameter("x")

    def forward(self, x: Any) -> str:
        if x == "hang":
            time.sleep(600)
        return "done"


def test_a_hung_agent_is_force_cancelled_and_recorded_as_a_timeout():
    executor = RayExecutor(timeout=1.0, grace=1.0)
    data = [Example(x="hang", info="done", id="h"), Example(x="fine", info="done", id="f")]
    started = time.monotonic()
    got = asyncio.run(executor.run(Sleeper(), ExactMatchGuide(), data, min_score=0.0))
    executor.close()
    assert time.monotonic() - started < 30
    assert got[0].failed and got[0].error.startswith("timeout") and got[0].score == 0.0
    assert got[1].output == "done" and not got[1].failed


class PidReporter(Agent):
    def __init__(self, model: OpenAIModel) -> None:
        self.model = model
        self.p = Parameter("hello")

    async def forward(self, x: Any) -> str:
        reply = await self.model.complete([{"role": "user", "content": self.p.value}])
        return f"{reply.text} {os.getpid()}"


def test_one_rate_limit_holds_across_two_worker_processes():
    rps = 4
    with FakeOpenAIServer("ok", rate_limit_rps=rps) as server:
        model = OpenAIModel("fake-model", base_url=server.base_url, requests_per_minute=60 * rps,
                            rate_limit_patience=0, max_retries=0)
        executor = RayExecutor(num_cpus=1)
        got = asyncio.run(executor.run(PidReporter(model), ExactMatchGuide(), examples(16)))
        executor.close()
        model.close()
        assert not [r.error for r in got if r.failed]
        assert len({r.output.split()[1] for r in got}) == 2  # two worker processes sent them
        assert server.rate_limited == 0 and len(server.chat_requests) == 16


class InstrumentedCaller(Agent):
    """Calls the OpenAI SDK through a client it makes (and instruments) on first use, in the worker."""

    def __init__(self, base_url: str, budget: Budget) -> None:
        self.base_url = base_url
        self.budget = budget
        self.client: Any = None
        self.p = Parameter("hello")

    def forward(self, x: Any) -> str:
        if self.client is None:
            self.client = openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0)
            instrument(self.client, budget=self.budget)
        reply = self.client.chat.completions.create(model="fake-model",
                                                    messages=[{"role": "user", "content": self.p.value}])
        return reply.choices[0].message.content


def test_instrumented_sdk_calls_on_workers_count_against_one_budget():
    budget = Budget(max_calls=5)
    with FakeOpenAIServer("ok") as server:
        executor = RayExecutor(max_in_flight=1)
        with meter_usage() as meter, pytest.raises(BudgetExceeded, match="5 calls"):
            asyncio.run(executor.run(InstrumentedCaller(server.base_url, budget), ExactMatchGuide(), examples(9)))
        executor.close()
        assert budget.calls == 5 and len(server.chat_requests) == 5
        assert meter.total.calls == 5


def test_asyncio_and_ray_agree_on_a_plain_evaluation():
    agent = world.LevelAgent(world.ScriptedModel(world.agent_reply, name="agent-model"), level=4)
    data = examples(8)
    expected = asyncio.run(AsyncioExecutor().run(agent, ExactMatchGuide(), data))
    executor = RayExecutor(actors=2, actor_concurrency=4)
    got = asyncio.run(executor.run(agent, ExactMatchGuide(), data))
    executor.close()
    assert timeless(got) == timeless(expected)


# ----------------------------------------------------------------------------- evaluate and collect on Ray


def test_evaluate_on_ray_gives_the_same_rollouts_as_in_one_process():
    from opto import evaluate

    data = examples(8)
    expected = evaluate(test_executors.level_agent(), ExactMatchGuide(), data)
    executor = RayExecutor()
    got = evaluate(test_executors.level_agent(), ExactMatchGuide(), data, executor=executor)
    executor.close()
    assert got.scores == expected.scores and got.mean == expected.mean
    assert timeless(got.rollouts) == timeless(expected.rollouts)


def test_collect_on_ray_writes_the_same_ledger_and_usage_as_in_one_process(tmp_path):
    import test_rl_data
    from opto import collect

    cloudpickle.register_pickle_by_value(test_rl_data)
    here = collect(test_rl_data.Sampler(test_rl_data.SeededModel()), ExactMatchGuide(), test_rl_data.DATA,
                   samples=3, run_dir=tmp_path / "here", progress=False)  # fmt: skip
    executor = RayExecutor()
    there = collect(test_rl_data.Sampler(test_rl_data.SeededModel()), ExactMatchGuide(), test_rl_data.DATA,
                    samples=3, run_dir=tmp_path / "ray", progress=False, executor=executor)  # fmt: skip
    executor.close()
    # Each example's group is written when its rollouts end: the groups' order is the workers'.
    assert sorted(ledger_of(tmp_path / "ray"), key=repr) == sorted(ledger_of(tmp_path / "here"), key=repr)
    assert (there.rollouts, there.mean_score, there.usage.calls) == (here.rollouts, here.mean_score, here.usage.calls)
    assert 0 < here.mean_score < 1  # the seeds differ between samples, on the workers too


def test_the_collect_command_runs_on_ray(tmp_path, capsys):
    from opto import RunDir
    from opto.cli import main

    with FakeOpenAIServer(reply="wrong") as server:
        code = main(["collect", "--ray", "--model", "fake", "--base-url", server.base_url, "--run-dir",
                     str(tmp_path / "c"), "--n", "3", "--samples", "2", "--no-progress"])  # fmt: skip
        seeds = sorted(request.get("seed") for request in server.chat_requests)
    assert code == 0 and "collected 6 rollouts" in capsys.readouterr().out
    assert seeds == [0, 0, 0, 1, 1, 1]  # sample k of every example ran with seed k, on the workers
    written = sorted((e.instance_id, e.sample) for e in RunDir(tmp_path / "c").events("rollout"))
    assert len(written) == 6 and {sample for _, sample in written} == {0, 1}
