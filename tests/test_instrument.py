"""Agents that call the OpenAI SDK directly: their calls traced, counted and budgeted."""

import json

import openai
import pytest

from opto import Agent, AggregatedUpdate, Budget, ExactMatchGuide, Optimizer, Parameter, RunDir, ScriptedModel
from opto.llm import instrument, record_llm_calls, uninstrument
from opto.testing import FakeOpenAIServer


def sdk_reply(request):
    system = request["messages"][0]["content"]
    return "4" if "digits" in system else "four"


class SDKAgent(Agent):
    """Calls an openai.AsyncOpenAI client directly, as most existing agents do."""

    def __init__(self, client):
        self.client = client
        self.prompt = Parameter("Answer.", description="system prompt")

    async def forward(self, question):
        reply = await self.client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "system", "content": self.prompt.value},
                                           {"role": "user", "content": question}])
        return reply.choices[0].message.content


class SyncSDKAgent(SDKAgent):
    def forward(self, question):  # run in a worker thread by the trainer
        reply = self.client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "system", "content": self.prompt.value},
                                           {"role": "user", "content": question}])
        return reply.choices[0].message.content


BRAIN = ScriptedModel(lambda messages: json.dumps({"reasoning": "digits", "reasoning_prompt": "digits",
                                                   "suggestion": {"prompt": "Reply in digits."}}))


@pytest.mark.parametrize("client_class, agent_class", [(openai.AsyncOpenAI, SDKAgent), (openai.OpenAI, SyncSDKAgent)])
def test_an_sdk_agent_is_traced_counted_and_trained(tmp_path, client_class, agent_class):
    with FakeOpenAIServer(reply=sdk_reply) as server:
        client = client_class(base_url=server.base_url, api_key="test")
        handle = instrument(client)
        try:
            trainer = AggregatedUpdate(agent_class(client), Optimizer(BRAIN), proposals="per_instance", validation="minibatch", final_check=None)
            result = trainer.train(ExactMatchGuide(), [("2+2", "4")], run_dir=tmp_path, progress=False)
        finally:
            handle.close()
    assert result.accepted == 1 and result.final_parameters == {"prompt": "Reply in digits."}
    [rollout] = [r for r in RunDir(tmp_path).ledger() if r["type"] == "rollout" and r["phase"] == "train"]
    assert rollout["trace"][0]["model"] == "gpt-4o-mini" and rollout["trace"][0]["response"] == "four"
    optimizer_prompt = next(r["messages"][-1]["content"] for r in reversed(BRAIN.requests)
                            if r["messages"][0]["content"].startswith("You improve the parameters"))
    assert "[reply] four" in optimizer_prompt  # the optimizer saw the SDK call in the trace
    sdk_usage = result.usage_by_model["gpt-4o-mini"]
    assert sdk_usage.calls == 2 and sdk_usage.cost_usd > 0  # train + validation rollouts, priced by the table


def test_nothing_is_recorded_outside_a_rollout_and_uninstrument_restores_the_client():
    with FakeOpenAIServer(reply="hi") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="test")
        original = client.chat.completions.create
        instrument(client)
        with pytest.raises(ValueError, match="already instrumented"):
            instrument(client)
        with record_llm_calls() as trace:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}])
        assert [c["messages"][-1]["content"] for c in trace] == ["a"]
        uninstrument(client)
        assert client.chat.completions.create == original


def test_a_budget_stops_sdk_calls():
    from opto.llm import BudgetExceeded

    with FakeOpenAIServer(reply="hi") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="test")
        handle = instrument(client, budget=Budget(max_calls=1))
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
        with pytest.raises(BudgetExceeded):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}])
        handle.close()
        assert len(server.chat_requests) == 1


def test_the_optimizer_prompt_shows_tool_calls_of_the_trace():
    from opto.core.rollout import Rollout

    trace = [{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "weather?"}], "response": "",
              "cached": False, "tool_calls": [{"id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'}]}]
    messages = Optimizer(BRAIN).build_messages([Parameter("Answer.", name="prompt")],
                                               Rollout(example_id="1", x="weather?", trace=trace))
    text = messages[-1]["content"]
    assert "[tool calls] [" in text and '"name": "get_weather"' in text
