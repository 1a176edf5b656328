"""RL data: trajectory groups from a run's rollouts (the "art" export), and opto.collect."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from opto import Agent, Budget, ExactMatchGuide, Parameter, RunDir, ScriptedModel, collect
from opto.cli import main
from opto.llm import Completion, ToolCall, sampling, tool_result
from opto.preference import DatasetFormatError, episode_problem, export_run, read_groups, validate_jsonl
from world import dataset, make_level_trainer

TOOLS = [{"type": "function", "function": {"name": "double", "parameters": {"type": "object", "properties": {}}}}]


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# ------------------------------------------------------------------- groups from a training run


@pytest.fixture(scope="module")
def validated_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The level world with minibatch validation: each example has a train and a candidate rollout per step."""
    path = tmp_path_factory.mktemp("validated")
    trainer, *_ = make_level_trainer()
    result = trainer.train(ExactMatchGuide(), dataset([0, 1, 2, 3, 4, 5]), batch_size=2, run_dir=path,
                           progress=False, shuffle=False)
    assert result.accepted > 0
    return path


def test_art_groups_hold_each_examples_rollouts_of_a_step_with_the_ledgers_scores(validated_run, tmp_path):
    report = export_run(validated_run, tmp_path / "groups.jsonl", format="art")
    groups = records(tmp_path / "groups.jsonl")
    assert report.records == len(groups) > 0 and validate_jsonl(tmp_path / "groups.jsonl", "art") == len(groups)
    rollouts = [r for r in RunDir(validated_run).ledger() if r["type"] == "rollout"]
    by_key = {}
    for r in rollouts:
        by_key.setdefault((r["step"], r["instance_id"]), []).append(r)
    for group in groups:
        meta = group["trajectories"][0]["metadata"]
        members = by_key[(meta["step"], meta["example_id"])]
        assert [t["reward"] for t in group["trajectories"]] == [r["score"] for r in members]
        assert [t["metadata"]["phase"] for t in group["trajectories"]] == [r["phase"] for r in members]
        assert len({t["metadata"]["values_hash"] for t in group["trajectories"]}) == len(members)  # other values
        assert len(set(t["reward"] for t in group["trajectories"])) > 1
        for trajectory in group["trajectories"]:
            assert episode_problem(trajectory["messages_and_choices"]) is None
            choice = trajectory["messages_and_choices"][-1]
            assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "stop"
    # every other (step, example) was dropped for equal rewards, and said so
    assert report.groups.dropped_groups == {"every reward equal": len(by_key) - len(groups)}
    assert report.groups.off_policy_trajectories == report.groups.trajectories  # scripted: no logprobs


def test_single_trajectory_groups_are_dropped_and_counted(tmp_path):
    trainer, *_ = make_level_trainer(validation="none")  # one rollout per example and step
    trainer.train(ExactMatchGuide(), dataset([0, 1]), run_dir=tmp_path / "run", progress=False, shuffle=False)
    reading = read_groups(tmp_path / "run")
    assert reading.groups == [] and reading.stats.dropped_groups == {"fewer than 2 trajectories": 2}
    with pytest.raises(ValueError, match="no trajectory group could be exported.*2 groups dropped"):
        export_run(tmp_path / "run", tmp_path / "g.jsonl", format="art")
    assert len(read_groups(tmp_path / "run", min_group_size=1, keep_constant_rewards=True).groups) == 2


class ToolAgent(Agent):
    """Asks its model, which calls a tool; answers with the model's second reply."""

    def __init__(self, model: ScriptedModel) -> None:
        self.model = model
        self.prompt = Parameter("Use the tool.", description="system prompt")

    async def forward(self, x: Any) -> str:
        messages = [{"role": "system", "content": self.prompt.value}, {"role": "user", "content": str(x)}]
        first = await self.model.complete(messages, tools=TOOLS)
        messages += [first.message(), *(tool_result(call, 2 * int(x)) for call in first.tool_calls)]
        return (await self.model.complete(messages, tools=TOOLS)).text


def tool_reply(messages: list[dict[str, Any]]) -> Any:
    if messages[-1]["role"] == "user":
        return Completion(texts=[""], sample_tool_calls=[[ToolCall(id="c1", name="double", arguments="{}")]])
    return messages[-1]["content"]


def test_tool_calls_and_results_survive_in_groups_from_collect(tmp_path):
    model = ScriptedModel(tool_reply)
    result = collect(ToolAgent(model), ExactMatchGuide(), [{"x": 2, "info": "4", "id": "a"}, {"x": 3, "info": "7",
                                                                                             "id": "b"}],
                     samples=2, run_dir=tmp_path / "c", progress=False)
    assert result.rollouts == 4 and result.failed == 0
    reading = read_groups(tmp_path / "c", keep_constant_rewards=True)
    assert [g.rewards for g in reading.groups] == [[1.0, 1.0], [0.0, 0.0]]
    trajectory = reading.groups[0].trajectories[0]
    roles = [m.get("role") or m["message"]["role"] for m in trajectory.messages_and_choices]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    asked = trajectory.messages_and_choices[2]
    assert asked["tool_calls"] == [{"id": "c1", "type": "function", "function": {"name": "double", "arguments": "{}"}}]
    assert trajectory.messages_and_choices[3] == {"role": "tool", "content": "4", "tool_call_id": "c1"}
    assert trajectory.tools == TOOLS and trajectory.metrics["model_calls"] == 2
    [earlier] = trajectory.additional_histories  # the first call, ending in its tool-call choice
    assert earlier["messages_and_choices"][-1]["finish_reason"] == "tool_calls"
    assert earlier["messages_and_choices"][-1]["message"]["tool_calls"][0]["function"]["name"] == "double"


@pytest.mark.parametrize("messages, problem", [
    ([], "no messages"),
    ([{"role": "assistant", "content": "hi"}], "the first message is assistant"),
    ([{"role": "user", "content": "q"}], "the last message is user"),
    ([{"role": "user", "content": "q"}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
     "two user messages in a row"),
    ([{"role": "user", "content": "q"}, {"role": "tool", "content": "4", "tool_call_id": "c"},
      {"role": "assistant", "content": "a"}], "a tool message (at 1) that answers no assistant tool call"),
    ([{"role": "developer", "content": "d"}, {"role": "assistant", "content": "a"}], "role 'developer'"),
])
def test_the_episode_order_rules(messages, problem):
    assert problem in episode_problem(messages)


def test_episodes_that_keep_the_rules_pass():
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert episode_problem([
        {"role": "system", "content": "s"}, {"role": "system", "content": "s2"}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [call, call]}, {"role": "tool", "content": "1",
                                                                             "tool_call_id": "c"},
        {"role": "tool", "content": "2", "tool_call_id": "c"},
        {"finish_reason": "stop", "index": 0, "message": {"role": "assistant", "content": "a"}, "logprobs": None},
    ]) is None


def test_validate_jsonl_refuses_an_art_record_out_of_order(tmp_path):
    bad = {"trajectories": [{"messages_and_choices": [{"role": "assistant", "content": "a"}], "reward": 1.0}]}
    (tmp_path / "bad.jsonl").write_text(json.dumps(bad) + "\n")
    with pytest.raises(DatasetFormatError, match="bad.jsonl:1.*the first message is assistant"):
        validate_jsonl(tmp_path / "bad.jsonl", "art")


# ------------------------------------------------------------------------------------- collect


class Sampler(Agent):
    """Replies with what its model says; the model answers right only for odd seeds."""

    def __init__(self, model: ScriptedModel) -> None:
        self.model = model
        self.prompt = Parameter("Double it.", description="system prompt")

    async def forward(self, x: Any) -> str:
        messages = [{"role": "system", "content": self.prompt.value}, {"role": "user", "content": str(x)}]
        return (await self.model.complete(messages, temperature=0.0, seed=123)).text


class SeededModel(ScriptedModel):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(lambda messages: "", **kwargs)

    async def _generate(self, messages: Any, **kwargs: Any) -> Completion:
        completion = await super()._generate(messages, **kwargs)
        x = int(messages[-1]["content"])
        completion.texts = [str(2 * x) if kwargs["seed"] % 2 else "wrong"]
        return completion


DATA = [{"x": x, "info": str(2 * x), "id": f"x{x}"} for x in range(5)]


def test_collect_draws_each_sample_with_its_own_seed_and_the_temperature(tmp_path):
    model = SeededModel()
    result = collect(Sampler(model), ExactMatchGuide(), DATA, samples=4, run_dir=tmp_path / "c", temperature=0.7,
                     seed=10, progress=False)
    assert (result.examples, result.rollouts, result.mean_score) == (5, 20, 0.5)
    assert sorted({(r["temperature"], r["seed"]) for r in model.requests}) == [(0.7, 10), (0.7, 11), (0.7, 12),
                                                                                (0.7, 13)]
    events = RunDir(tmp_path / "c").events("rollout")
    assert [(e.instance_id, e.sample, e.phase, e.step) for e in events[:4]] == [("x0", k, "collect", 1)
                                                                               for k in range(4)]
    report = export_run(tmp_path / "c", tmp_path / "g.jsonl", format="art")
    assert report.records == 5 and all(r["trajectories"][0]["metadata"]["sample"] == 0
                                       for r in records(tmp_path / "g.jsonl"))


async def test_sampling_overrides_only_inside_its_block():
    model = SeededModel()
    agent = Sampler(model)
    with sampling(temperature=1.0, seed=3):
        assert await agent.arun(4) == "8"
    assert await agent.arun(4) == "8"  # the agent's own seed=123 (odd too) and temperature 0 again
    with sampling(seed=8):  # only what is given is overridden
        assert await agent.arun(4) == "wrong"
    assert [(r["temperature"], r["seed"]) for r in model.requests] == [(1.0, 3), (0.0, 123), (0.0, 8)]
    with pytest.raises(ValueError, match="temperature"):
        with sampling(temperature=5):
            pass


def test_a_collection_resumes_after_a_budget_stop_and_refuses_other_settings(tmp_path):
    run_dir = tmp_path / "c"
    stopped = collect(Sampler(SeededModel(budget=Budget(max_calls=9))), ExactMatchGuide(), DATA, samples=4,
                      run_dir=run_dir, concurrency=4, progress=False)
    assert stopped.stopped_reason and "budget" in stopped.stopped_reason
    written = {e.instance_id for e in RunDir(run_dir).events("rollout")}
    assert 0 < len(written) < 5 and stopped.rollouts == 4 * len(written)
    with pytest.raises(ValueError, match="resume=True"):
        collect(Sampler(SeededModel()), ExactMatchGuide(), DATA, samples=4, run_dir=run_dir, progress=False)
    with pytest.raises(ValueError, match="samples=4, this call has samples=3"):
        collect(Sampler(SeededModel()), ExactMatchGuide(), DATA, samples=3, run_dir=run_dir, resume=True,
                progress=False)
    model = SeededModel()
    resumed = collect(Sampler(model), ExactMatchGuide(), DATA, samples=4, run_dir=run_dir, resume=True,
                      progress=False)
    assert resumed.skipped_examples == len(written) and len(model.requests) == 4 * (5 - len(written))
    events = RunDir(run_dir).events("rollout")
    assert sorted(e.instance_id for e in events) == sorted(f"x{x}" for x in range(5) for _ in range(4))


def test_collect_checks_its_arguments(tmp_path):
    with pytest.raises(ValueError, match="samples must be an int >= 2"):
        collect(Sampler(SeededModel()), ExactMatchGuide(), DATA, samples=1, run_dir=tmp_path / "c")
    trainer, *_ = make_level_trainer()
    trainer.train(ExactMatchGuide(), dataset([0]), run_dir=tmp_path / "t", progress=False)
    with pytest.raises(ValueError, match="opto.collect did not write"):
        collect(Sampler(SeededModel()), ExactMatchGuide(), DATA, run_dir=tmp_path / "t")


def test_cli_export_art_prints_the_group_counts(validated_run, tmp_path, capsys):
    out = tmp_path / "g.jsonl"
    assert main(["export", str(validated_run), "--format", "art", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {len(records(out))} art records" in printed and "groups dropped (every reward equal)" in printed


# ------------------------------------------------------------------------------ logprobs


@pytest.mark.parametrize("backend", ["openai", "litellm"])
async def test_logprobs_reach_the_completion_the_trace_and_the_cache(tmp_path, backend):
    from opto import OpenAIModel, ResponseCache
    from opto.llm import LiteLLMModel, record_llm_calls
    from opto.testing import FakeOpenAIServer

    with FakeOpenAIServer(reply=lambda request: "four apples") as server:
        cache = ResponseCache(tmp_path / "cache.sqlite")
        model = (OpenAIModel("gpt-4o-mini", base_url=server.base_url, api_key="test", cache=cache)
                 if backend == "openai" else
                 LiteLLMModel("gpt-4o-mini", custom_llm_provider="openai", api_base=server.base_url, api_key="test",
                              cache=cache))
        try:
            with record_llm_calls() as trace:
                fresh = await model.complete([{"role": "user", "content": "2+2 apples?"}], logprobs=True)
                again = await model.complete([{"role": "user", "content": "2+2 apples?"}], logprobs=True)
                plain = await model.complete([{"role": "user", "content": "2+2 apples?"}])
        finally:
            await model.aclose()
        sent = server.chat_requests
    assert [t["token"] for t in fresh.logprobs] == ["four ", "apples"] and fresh.logprobs[0]["logprob"] < 0
    assert again.cached and again.logprobs == fresh.logprobs  # from the cache, logprobs included
    assert plain.logprobs == [] and len(sent) == 2 and sent[0]["logprobs"] is True and "logprobs" not in sent[1]
    assert trace[0]["logprobs"] == fresh.logprobs and "logprobs" not in trace[2]


class OnPolicy(Agent):
    def __init__(self, model: ScriptedModel) -> None:
        self.model = model
        self.prompt = Parameter("Double it.", description="system prompt")

    async def forward(self, x: Any) -> str:
        messages = [{"role": "system", "content": self.prompt.value}, {"role": "user", "content": str(x)}]
        return (await self.model.complete(messages, logprobs=True)).text


def test_groups_of_rollouts_with_logprobs_are_on_policy(tmp_path):
    def reply(messages):
        return Completion(texts=["4"], sample_logprobs=[[{"token": "4", "logprob": -0.2}]])

    collect(OnPolicy(ScriptedModel(reply)), ExactMatchGuide(), [{"x": 2, "info": "4", "id": "a"},
                                                                 {"x": 3, "info": "6", "id": "b"}],
            samples=2, run_dir=tmp_path / "c", progress=False)
    reading = read_groups(tmp_path / "c", keep_constant_rewards=True)
    assert reading.stats.off_policy_trajectories == 0 and reading.stats.trajectories == 4
    choice = reading.groups[0].trajectories[0].messages_and_choices[-1]
    assert choice["logprobs"] == {"content": [{"token": "4", "logprob": -0.2}]}


def test_a_models_own_samples_export_as_right_over_wrong_pairs_every_backend_takes(tmp_path):
    """What a chain's later stage learns from (``RUN/collect-<stage>``), exported for any
    backend: per question a correct sample over a wrong one, and the judged groups."""
    import asyncio

    from opto.finetune import NeMoCustomizerAdapter, OpenAIFineTuneAdapter
    from opto.testing import FakeNeMoCustomizer, FakeOpenAIServer

    collect(Sampler(SeededModel()), ExactMatchGuide(), DATA, samples=4, run_dir=tmp_path / "c", temperature=0.7,
            progress=False)
    for fmt, check in (("openai-dpo", "openai-dpo"), ("nemo", "nemo"), ("trl-chat", "trl-chat"), ("art", "art")):
        report = export_run(tmp_path / "c", tmp_path / f"{fmt}.jsonl", source="agent", format=fmt)
        assert validate_jsonl(tmp_path / f"{fmt}.jsonl", check) == report.records == len(DATA)
    for pair in records(tmp_path / "openai-dpo.jsonl"):  # the same question: the right answer over "wrong"
        question = int(pair["input"]["messages"][-1]["content"])
        assert pair["preferred_output"][0]["content"] == str(2 * question)
        assert pair["non_preferred_output"][0]["content"] == "wrong"
    groups = records(tmp_path / "art.jsonl")
    assert all(sorted(t["reward"] for t in g["trajectories"]) == [0.0, 0.0, 1.0, 1.0] for g in groups)

    async def submit() -> tuple[str, str]:
        with FakeOpenAIServer() as openai, FakeNeMoCustomizer() as nemo:
            to_openai = OpenAIFineTuneAdapter("gpt-4o-mini", base_url=openai.base_url, api_key="sk-test",
                                              min_examples=len(DATA))  # OpenAI asks for 10; the fake, any
            to_nemo = NeMoCustomizerAdapter("meta/llama-3.2-1b-instruct@v1.0.0+A100", base_url=nemo.base_url,
                                            min_examples=len(DATA))
            try:
                done = [await a.wait_until_complete(await a.submit(tmp_path / f), poll_interval=0.01, timeout=10)
                        for a, f in ((to_openai, "openai-dpo.jsonl"), (to_nemo, "nemo.jsonl"))]
            finally:
                await to_openai.aclose()
            return done[0].status, done[1].status

    assert asyncio.run(submit()) == ("succeeded", "succeeded")
