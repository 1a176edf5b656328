"""`RemoteExecutor` against the in-process `FakeCluster`: crashes, hangs, lost nodes,
budgets, rate limits, shipping errors and logs, without Ray (milliseconds each)."""

from __future__ import annotations

import asyncio
import logging
import pickle
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import world
from world import ledger_of, timeless
from opto import Agent, AsyncioExecutor, Budget, ExactMatchGuide, Example, OpenAIModel, Parameter, ScriptedModel
from opto.executors import RemoteExecutor, ShippingError, WorkerError
from opto.executors.shipping import ship
from opto.executors.worker import unload_all
from opto.llm.errors import BudgetExceeded
from opto.llm.sampling import current_sampling, sampling
from opto.llm.usage import meter_usage
from opto.testing import FakeOpenAIServer
from opto.testing.fake_cluster import FakeCluster


@pytest.fixture(autouse=True)
def _unload_worker_copies():
    """The fake workers share this process: drop the agents they loaded after each test."""
    yield
    unload_all()


def examples(n: int) -> list[Example]:
    return [Example(x=x, info=str(2 * x), id=f"x{x}") for x in range(n)]


def level_agent(**kwargs: Any) -> world.LevelAgent:
    return world.LevelAgent(ScriptedModel(world.agent_reply, name="agent-model", **kwargs), level=3)


def run(executor: Any, agent: Agent, data: list[Example], **kwargs: Any) -> list[Any]:
    return asyncio.run(executor.run(agent, ExactMatchGuide(), data, **kwargs))


def counting_run(run_dir: Path, executor: Any = None, agent_class: type | None = None) -> dict[str, Any]:
    """`world.make_run` with rollouts on `executor` (None: in-process asyncio), its agent
    made by `agent_class` (a `world.Counter` subclass) when given."""
    trainer_class, counter_class = world.AggregatedUpdate, world.Counter

    def with_executor(*args: Any, **kwargs: Any) -> Any:
        return trainer_class(*args, executor=executor, **kwargs)

    world.AggregatedUpdate = with_executor
    world.Counter = agent_class or counter_class
    try:
        return world.make_run(run_dir)
    finally:
        world.AggregatedUpdate, world.Counter = trainer_class, counter_class


# ----------------------------------------------------------------------------- same results


def test_rollouts_equal_the_asyncio_executors_and_each_is_reported_once():
    data = examples(6)
    expected = run(AsyncioExecutor(), level_agent(), data, values=None)
    seen: list[str] = []
    cluster = FakeCluster(workers=2)
    got = run(RemoteExecutor(cluster), level_agent(), data, on_result=lambda r: seen.append(r.example_id))
    assert timeless(got) == timeless(expected)
    assert cluster._link is None  # no budget or rate limit to share: no coordinator started
    assert [r.parameters_read for r in got] == [["system_prompt"]] * 6
    assert sorted(seen) == sorted(e.id for e in data)


def test_values_travel_by_name_and_override_the_stored_ones():
    agent = level_agent()
    cluster = FakeCluster()
    got = run(RemoteExecutor(cluster), agent, examples(5), values={agent.system_prompt: "level 10"})
    assert [r.score for r in got] == [1.0] * 5  # level 10 answers every x < 10
    assert agent.system_prompt.value == "level 3"


def test_a_training_run_writes_the_same_ledger_as_in_one_process(tmp_path):
    expected = counting_run(tmp_path / "asyncio")
    cluster = FakeCluster(workers=2)
    got = counting_run(tmp_path / "remote", RemoteExecutor(cluster))
    assert ledger_of(tmp_path / "remote") == ledger_of(tmp_path / "asyncio")
    assert got["usage"] == expected["usage"]  # the workers' calls are counted by the driver's meter
    assert got["final_parameters"] == expected["final_parameters"]


def test_a_worker_killed_at_a_random_rollout_is_retried_and_recorded_once(tmp_path, caplog):
    counting_run(tmp_path / "asyncio")
    victim = f"q{random.Random(7).randint(1, 8)}"
    cluster = FakeCluster(faults=lambda example, attempt: "crash" if example == victim and attempt == 1 else None)
    with caplog.at_level(logging.WARNING, logger="opto.executors"):
        counting_run(tmp_path / "remote", RemoteExecutor(cluster))
    assert ledger_of(tmp_path / "remote") == ledger_of(tmp_path / "asyncio")
    retries = [r.getMessage() for r in caplog.records if "lost its worker" in r.getMessage()]
    assert len(retries) == 1 and victim in retries[0] and "attempt 1/3" in retries[0]


def test_a_rollout_whose_worker_always_dies_is_one_failed_rollout():
    cluster = FakeCluster(faults=lambda example, attempt: "node" if example == "x1" else None)
    seen: list[str] = []
    got = run(RemoteExecutor(cluster, max_attempts=2), level_agent(), examples(3), min_score=0.0,
              on_result=lambda r: seen.append(r.example_id))
    failed = got[1]
    assert failed.failed and failed.score == 0.0
    assert "worker lost" in failed.error and "node" in failed.error and "tried 2 times" in failed.error
    assert seen.count("x1") == 1 and not got[0].failed and not got[2].failed
    assert cluster.submitted == 4


def test_a_hung_rollout_is_cancelled_and_recorded_as_a_timeout():
    cluster = FakeCluster(faults=lambda example, attempt: "hang" if example == "x2" else None)
    executor = RemoteExecutor(cluster, grace=0.1)
    started = time.monotonic()
    got = run(executor, level_agent(), examples(4), timeout=0.3, min_score=0.0)
    assert time.monotonic() - started < 3
    in_process = asyncio.run(_timed_out_in_process())
    assert got[2].error == in_process.error and got[2].feedback == in_process.feedback
    assert got[2].score == 0.0 and cluster.cancelled == 1
    assert [r.failed for r in got] == [False, False, True, False]


async def _timed_out_in_process() -> Any:
    class Slow(Agent):
        def __init__(self) -> None:
            self.p = Parameter("x")

        async def forward(self, x: Any) -> str:
            await asyncio.sleep(5)
            return "late"

    return (await AsyncioExecutor(timeout=0.3).run(Slow(), ExactMatchGuide(), examples(1), min_score=0.0))[0]


def test_an_async_agent_is_stopped_by_the_workers_own_timeout_with_its_trace():
    class SlowAfterACall(Agent):
        def __init__(self) -> None:
            self.model = ScriptedModel(lambda messages: "first")
            self.p = Parameter("x")

        async def forward(self, x: Any) -> str:
            await self.model.complete([{"role": "user", "content": self.p.value}])
            await asyncio.sleep(30)
            return "late"

    cluster = FakeCluster()
    got = run(RemoteExecutor(cluster, grace=5.0), SlowAfterACall(), examples(1), timeout=0.2)
    assert got[0].error.startswith("timeout") and len(got[0].trace) == 1
    assert cluster.cancelled == 0  # stopped in the worker, not killed


def test_a_worker_that_cannot_load_the_agent_stops_the_run_with_the_reason():
    class Unloadable(Agent):
        def __init__(self) -> None:
            self.p = Parameter("x")

        def forward(self, x: Any) -> str:
            return "x"

        def __setstate__(self, state: dict[str, Any]) -> None:
            raise ImportError("No module named 'my_agents'")

    with pytest.raises(WorkerError, match="my_agents"):
        run(RemoteExecutor(FakeCluster()), Unloadable(), examples(2))


# ------------------------------------------------------------------------------- shipping


def test_an_agent_that_cannot_be_pickled_is_refused_naming_the_attribute_before_any_rollout():
    agent = level_agent()
    agent.helpers = {"lock": threading.Lock()}
    cluster = FakeCluster()
    with pytest.raises(ShippingError) as caught:
        run(RemoteExecutor(cluster), agent, examples(3))
    assert "agent.helpers['lock']" in str(caught.value) and "_thread.lock" in str(caught.value)
    assert cluster.submitted == 0


def test_models_pickle_without_their_key_and_a_worker_without_one_says_where_to_set_it(monkeypatch):
    secret = "sk-test-secret-4242"
    with FakeOpenAIServer("ok") as server:
        model = OpenAIModel("fake-model", base_url=server.base_url, api_key=secret, max_retries=0)

        class Caller(Agent):
            def __init__(self) -> None:
                self.model = model
                self.p = Parameter("hi")

            async def forward(self, x: Any) -> str:
                return (await self.model.complete([{"role": "user", "content": self.p.value}])).text

        assert secret.encode() not in ship(Caller(), ExactMatchGuide()).blob
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        failed = run(RemoteExecutor(FakeCluster()), Caller(), examples(1))[0]
        assert "OPENAI_API_KEY" in failed.error and "worker" in failed.error
        monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-workers-environment")
        worked = run(RemoteExecutor(FakeCluster()), Caller(), [Example(x=1, info="ok", id="a")])[0]
        assert worked.output == "ok" and worked.score == 1.0
        model.close()


def test_a_copy_of_a_model_works_after_unpickling():
    with FakeOpenAIServer("pong") as server:
        model = OpenAIModel("fake-model", base_url=server.base_url, requests_per_minute=600,
                            budget=Budget(max_calls=10))
        assert asyncio.run(model.complete([{"role": "user", "content": "ping"}])).text == "pong"
        copy = pickle.loads(pickle.dumps(model))
        assert asyncio.run(copy.complete([{"role": "user", "content": "ping"}])).text == "pong"
        assert copy.usage.calls == 1 and model.usage.calls == 1  # each counts its own calls
        assert copy.budget is not model.budget and copy.budget.calls == 2  # outside a run: an independent copy
        model.close()
        copy.close()


# --------------------------------------------------------------------- one budget, one limit


class OneCallAgent(Agent):
    def __init__(self, model: Any) -> None:
        self.model = model
        self.prompt = Parameter("say ok")

    async def forward(self, x: Any) -> str:
        return (await self.model.complete([{"role": "user", "content": self.prompt.value}])).text


def test_one_budget_holds_for_every_worker_and_the_driver_sees_what_was_spent():
    budget = Budget(max_calls=5)
    agent = OneCallAgent(ScriptedModel(lambda messages: "ok", budget=budget))
    cluster = FakeCluster(workers=3)
    with meter_usage() as meter, pytest.raises(BudgetExceeded, match="5 calls"):
        run(RemoteExecutor(cluster, max_in_flight=1), agent, examples(9))
    assert budget.calls == 5 and budget.remaining()["calls"] == 0
    assert meter.total.calls == 5  # every paid call reached the driver's meter
    with pytest.raises(BudgetExceeded):  # counted here again: the next call is refused too
        asyncio.run(agent.model.complete([{"role": "user", "content": "one more"}]))


def test_a_training_run_stops_on_the_shared_budget_and_resumes_to_the_same_ledger(tmp_path):
    data = [{"x": x, "info": str(2 * x), "id": f"x{x}"} for x in range(6)]

    def train(run_dir: Path, executor: Any, budget: Budget | None, resume: bool = False) -> Any:
        trainer, agent, agent_model, _ = world.make_level_trainer(level=2, executor=executor)
        agent_model.budget = budget
        return trainer.train(ExactMatchGuide(), data, batch_size=2, run_dir=run_dir, resume=resume, progress=False,
                             shuffle=False, test_dataset=data)

    reference = train(tmp_path / "whole", None, None)
    stopped = train(tmp_path / "cut", RemoteExecutor(FakeCluster()), Budget(max_calls=12))
    assert stopped.stopped_reason and "budget" in stopped.stopped_reason
    resumed = train(tmp_path / "cut", RemoteExecutor(FakeCluster()), None, resume=True)
    assert resumed.final_parameters == reference.final_parameters
    assert resumed.test_scores == reference.test_scores
    assert ledger_of(tmp_path / "cut") == ledger_of(tmp_path / "whole")


def test_one_rate_limit_holds_for_every_worker_against_a_limited_server():
    rps = 5
    with FakeOpenAIServer("ok", rate_limit_rps=rps) as server:
        model = OpenAIModel("fake-model", base_url=server.base_url, requests_per_minute=60 * rps,
                            rate_limit_patience=0, max_retries=0)
        cluster = FakeCluster(workers=3)
        started = time.monotonic()
        got = run(RemoteExecutor(cluster), OneCallAgent(model), examples(15))
        elapsed = time.monotonic() - started
        assert [r.output for r in got] == ["ok"] * 15 and not any(r.failed for r in got)
        assert server.rate_limited == 0
        assert elapsed >= (15 - rps) / rps * 0.9  # the limit held: 3 workers did not each get 5 a second
        link = cluster.link()
        assert len(link.coordinator._limiters) == 1
        assert model._limits._link is None  # handed back to the driver after the run
        model.close()


# ----------------------------------------------------------------------------- the rest


def test_worker_warnings_reach_the_drivers_log_and_info_does_not(caplog):
    class Chatty(Agent):
        def __init__(self) -> None:
            self.p = Parameter("x")

        def forward(self, x: Any) -> str:
            logging.getLogger("my.agent").warning("careful with %s", x)
            logging.getLogger("my.agent").info("chatty about %s", x)
            return "x"

    with caplog.at_level(logging.INFO, logger="my.agent"):
        run(RemoteExecutor(FakeCluster()), Chatty(), examples(2))
    passed_on = [r.getMessage() for r in caplog.records if "(worker pid" in r.getMessage()]
    assert sorted(m.split(") ", 1)[1] for m in passed_on) == ["careful with 0", "careful with 1"]
    assert all(r.levelno == logging.WARNING and r.name == "my.agent"
               for r in caplog.records if "(worker pid" in r.getMessage())


def test_a_sampling_block_reaches_the_workers():
    class Reports(Agent):
        def __init__(self) -> None:
            self.p = Parameter("x")

        def forward(self, x: Any) -> str:
            found = current_sampling()
            return f"{found.temperature}/{found.seed}" if found else "none"

    async def inside() -> list[Any]:
        with sampling(temperature=1.0, seed=7):
            return await RemoteExecutor(FakeCluster()).run(Reports(), ExactMatchGuide(), examples(2))

    assert [r.output for r in asyncio.run(inside())] == ["1.0/7", "1.0/7"]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="max_attempts"):
        RemoteExecutor(FakeCluster(), max_attempts=0)
    with pytest.raises(ValueError, match="max_in_flight"):
        RemoteExecutor(FakeCluster(), max_in_flight=0)
    with pytest.raises(ValueError, match="timeout"):
        RemoteExecutor(FakeCluster(), timeout=0)
