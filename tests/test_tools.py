"""Tool calls: in the model layer, in traces, in the optimizer's prompt, and for agents that
call the OpenAI SDK or LiteLLM directly with tools (traced, counted, budgeted, trained)."""

from __future__ import annotations

import json

import openai
import pytest

from opto import Agent, AggregatedUpdate, Budget, ExactMatchGuide, Optimizer, Parameter, RunDir, ScriptedModel
from opto.llm import (
    BudgetExceeded,
    Completion,
    LiteLLMModel,
    OpenAIModel,
    ResponseCache,
    ToolCall,
    instrument,
    instrument_litellm,
    record_llm_calls,
    tool_result,
    uninstrument_litellm,
)
from opto.llm.tracing import bounded_trace
from opto.core.rollout import Rollout
from opto.testing import FakeOpenAIServer, FakeReply

pytestmark = pytest.mark.timeout(60)

TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluates a sum of integers such as '2+2'.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
QUESTION = [{"role": "user", "content": "2+2"}]


def add(expression: str) -> int:
    return sum(int(part) for part in expression.split("+"))


def tool_server_reply(request):
    """Asks for the calculator first; once its result is there, answers in digits or words
    depending on the system prompt."""
    messages = request["messages"]
    if messages[-1]["role"] != "tool":
        question = messages[-1]["content"]
        return FakeReply("", tool_calls=[{"name": "calculator", "arguments": {"expression": question}}])
    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    return messages[-1]["content"] if "digits" in system else "four"


# ------------------------------------------------------------------ the model layer


@pytest.mark.parametrize("backend", ["openai", "litellm"])
async def test_complete_sends_tools_and_returns_the_tool_calls(backend):
    with FakeOpenAIServer(reply=tool_server_reply) as server:
        model = (OpenAIModel("gpt-4o-mini", base_url=server.base_url, api_key="test-key") if backend == "openai"
                 else LiteLLMModel("gpt-4o-mini", custom_llm_provider="openai", api_base=server.base_url,
                                   api_key="test-key"))
        try:
            with record_llm_calls() as trace:
                first = await model.complete(QUESTION, tools=TOOLS, tool_choice="auto")
                [call] = first.tool_calls
                result = add(json.loads(call.arguments)["expression"])
                conversation = [*QUESTION, first.message(), tool_result(call, result)]
                second = await model.complete(conversation, tools=TOOLS)
        finally:
            model.close()
        sent = server.chat_requests
    assert first.finish_reason == "tool_calls" and call.name == "calculator" and call.id
    assert json.loads(call.arguments) == {"expression": "2+2"}
    assert sent[0]["tools"] == TOOLS and sent[0]["tool_choice"] == "auto"
    assert sent[1]["messages"][1]["tool_calls"][0]["id"] == call.id
    assert sent[1]["messages"][2] == {"role": "tool", "tool_call_id": call.id, "content": "4"}
    assert second.text == "four" and second.tool_calls == []
    assert [sorted(entry) for entry in trace] == [
        ["cached", "messages", "model", "response", "tool_calls", "tools"], ["tool_result"],
        ["cached", "messages", "model", "response", "tools"]]
    assert trace[0]["tool_calls"] == [call.model_dump()] and trace[1]["tool_result"]["tool_call_id"] == call.id


async def test_tool_calls_are_cached_with_the_reply(tmp_path):
    with FakeOpenAIServer(reply=tool_server_reply) as server:
        model = OpenAIModel("m", base_url=server.base_url, cache=ResponseCache(tmp_path / "cache.sqlite"))
        try:
            paid = await model.complete(QUESTION, tools=TOOLS)
            replayed = await model.complete(QUESTION, tools=TOOLS)
            without_tools = await model.complete(QUESTION)  # another request: not the cached one
        finally:
            model.close()
        assert len(server.chat_requests) == 2 and "tools" not in server.chat_requests[1]
    assert replayed.cached and replayed.tool_calls == paid.tool_calls and replayed.finish_reason == "tool_calls"
    assert not without_tools.cached  # the same messages without tools are another request


async def test_a_cache_file_from_before_tool_calls_still_opens(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE responses (key TEXT PRIMARY KEY, text TEXT NOT NULL, finish_reason TEXT)")
    db.execute("INSERT INTO responses VALUES ('k', 'old reply', 'stop')")
    db.commit()
    db.close()
    assert ResponseCache(path).get("k") == ("old reply", "stop", [], [])  # no tool calls, no logprobs


@pytest.mark.parametrize("messages, tools, tool_choice, message", [
    ([{"role": "tool", "content": "4"}], None, None, "tool_call_id"),
    (QUESTION, None, "auto", "tool_choice needs tools"),
    (QUESTION, [{"name": "calculator"}], None, r"tools\[0\] must be"),
    (QUESTION, [], None, "non-empty list"),
])
async def test_bad_tool_input_is_refused_with_what_to_do(messages, tools, tool_choice, message):
    model = ScriptedModel(["never sent"])
    with pytest.raises(ValueError, match=message):
        await model.complete(messages, tools=tools, tool_choice=tool_choice)
    assert model.requests == []


async def test_an_assistant_message_with_tool_calls_needs_no_content():
    model = ScriptedModel(["4"])
    call = ToolCall(id="c1", name="calculator", arguments='{"expression": "2+2"}')
    conversation = [*QUESTION, {"role": "assistant", "tool_calls": [call.to_message_part()]},
                    tool_result(call, 4)]
    assert (await model.complete(conversation, tools=TOOLS)).text == "4"


async def test_scripted_tool_calls_and_a_tool_call_without_tools_is_refused():
    from opto.llm import LLMRequestError

    scripted = Completion(texts=[""], sample_tool_calls=[[ToolCall(id="c1", name="calculator")]])
    assert (await ScriptedModel([scripted]).complete(QUESTION, tools=TOOLS)).tool_calls[0].name == "calculator"
    with pytest.raises(LLMRequestError, match="without tools"):
        await ScriptedModel([scripted]).complete(QUESTION)


def test_tool_result_accepts_sdk_and_dict_tool_calls():
    sdk_call = openai.types.chat.ChatCompletionMessageToolCall(
        id="c9", type="function", function={"name": "calculator", "arguments": "{}"})
    assert tool_result(sdk_call, "ok") == {"role": "tool", "tool_call_id": "c9", "content": "ok"}
    assert tool_result({"id": "c2", "name": "calculator"}, {"sum": 4})["content"] == '{"sum": 4}'
    with pytest.raises(ValueError, match="function name"):
        tool_result({"id": "c3"}, "x")


# ------------------------------------------------------------------ the optimizer's view


def test_a_long_trace_is_cut_in_the_middle_with_a_note():
    calls = [{"model": "m", "messages": [{"role": "user", "content": f"question {i} " + "x" * 300}],
              "response": f"answer {i}", "cached": False} for i in range(40)]
    bounded = bounded_trace(calls, max_chars=3000)
    assert bounded[0]["response"] == "answer 0" and bounded[-1]["response"] == "answer 39"
    [note] = [entry for entry in bounded if "omitted" in entry]
    kept = [entry for entry in bounded if "omitted" not in entry]
    assert note["omitted"] == 40 - len(kept) > 0
    assert len(json.dumps(kept)) <= 3000
    huge = [{"model": "m", "messages": [{"role": "user", "content": "start " + "y" * 50_000 + " end"}],
             "response": "r", "cached": False}]
    [clipped] = bounded_trace(huge, max_chars=4000)
    content = clipped["messages"][0]["content"]
    assert content.startswith("start ") and content.endswith(" end") and "characters cut" in content
    assert bounded_trace(calls[:2], max_chars=10_000) == calls[:2]  # a short trace is shown whole


def test_the_optimizer_prompt_shows_tool_calls_results_and_the_cut():
    trace = [{"model": "gpt-4o-mini", "messages": QUESTION, "response": "", "cached": False,
              "tool_calls": [{"id": "c1", "name": "calculator", "arguments": '{"expression": "2+2"}'}],
              "tools": TOOLS},
             {"tool_result": {"tool_call_id": "c1", "name": "calculator", "content": "4"}}]
    trace += [{"model": "gpt-4o-mini", "messages": QUESTION, "response": f"filler {i} " + "z" * 500,
               "cached": False} for i in range(30)]
    optimizer = Optimizer(ScriptedModel([]), max_trace_chars=4000)
    text = optimizer.build_messages([Parameter("Answer.", name="prompt")],
                                    Rollout(example_id="1", x="2+2", trace=trace))[-1]["content"]
    assert "tools offered: calculator" in text and '"name": "calculator"' in text
    assert "## Tool result (calculator, call c1)\n4" in text
    assert "calls and tool results cut here" in text and "filler 29" in text and "filler 5 " not in text


# ------------------------------------------------------------------ agents that call the SDK or LiteLLM


class ToolAgent(Agent):
    """Asks a model that may call a calculator tool, runs the tool, and asks again."""

    def __init__(self, create):
        self.create = create
        self.prompt = Parameter("Answer.", description="system prompt")

    def conversation(self, question):
        return [{"role": "system", "content": self.prompt.value}, {"role": "user", "content": question}]

    def run_tools(self, messages, reply):
        message = reply.choices[0].message
        messages.append(message)
        for call in message.tool_calls:
            messages.append(tool_result(call, add(json.loads(call.function.arguments)["expression"])))

    async def forward(self, question):
        messages = self.conversation(question)
        reply = await self.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
        if reply.choices[0].message.tool_calls:
            self.run_tools(messages, reply)
            reply = await self.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
        return reply.choices[0].message.content


class SyncToolAgent(ToolAgent):
    def forward(self, question):  # the trainer runs it in a worker thread
        messages = self.conversation(question)
        reply = self.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
        if reply.choices[0].message.tool_calls:
            self.run_tools(messages, reply)
            reply = self.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
        return reply.choices[0].message.content


BRAIN = ScriptedModel(lambda messages: json.dumps({"reasoning": "digits", "suggestion": {"prompt": "Reply in digits."}}))


def make_agent(kind, server, budget=None):
    """(agent, instrumentation handle) for one way of calling a model with tools."""
    import litellm

    if kind == "litellm":
        handle = instrument_litellm(budget=budget)

        async def create(**kwargs):
            return await litellm.acompletion(custom_llm_provider="openai", api_base=server.base_url,
                                             api_key="test-key", **kwargs)

        return ToolAgent(create), handle
    if kind == "litellm-sync":
        handle = instrument_litellm(budget=budget)
        return SyncToolAgent(lambda **kwargs: litellm.completion(
            custom_llm_provider="openai", api_base=server.base_url, api_key="test-key", **kwargs)), handle
    client_class, agent_class = {"async": (openai.AsyncOpenAI, ToolAgent), "sync": (openai.OpenAI, SyncToolAgent)}[kind]
    client = client_class(base_url=server.base_url, api_key="test-key")
    handle = instrument(client, budget=budget)  # before the agent takes a reference to `create`
    return agent_class(client.chat.completions.create), handle


@pytest.mark.parametrize("kind", ["async", "sync", "litellm", "litellm-sync"])
def test_an_agent_with_tools_is_traced_counted_and_trained(tmp_path, kind):
    with FakeOpenAIServer(reply=tool_server_reply) as server:
        agent, handle = make_agent(kind, server)
        try:
            trainer = AggregatedUpdate(agent, Optimizer(BRAIN), proposals="per_instance", validation="minibatch", final_check=None)
            result = trainer.train(ExactMatchGuide(), [("2+2", "4")], run_dir=tmp_path, progress=False)
        finally:
            handle.close()
    assert result.accepted == 1 and result.final_parameters == {"prompt": "Reply in digits."}
    [rollout] = [r for r in RunDir(tmp_path).ledger() if r["type"] == "rollout" and r["phase"] == "train"]
    first, tool, second = rollout["trace"]
    assert first["tool_calls"][0]["name"] == "calculator" and first["tools"] == TOOLS
    assert tool["tool_result"]["content"] == "4" and tool["tool_result"]["tool_call_id"] == first["tool_calls"][0]["id"]
    assert second["messages"][-1]["role"] == "tool" and second["response"] == "four"
    optimizer_prompt = next(r["messages"][-1]["content"] for r in reversed(BRAIN.requests)
                            if r["messages"][0]["content"].startswith("You improve the parameters"))
    assert '"name": "calculator"' in optimizer_prompt and "## Tool result (calculator" in optimizer_prompt
    usage = result.usage_by_model["gpt-4o-mini"]
    assert usage.calls == 4 and usage.cost_usd > 0  # two calls in each of the train and validation rollouts


@pytest.mark.parametrize("kind", ["async", "sync", "litellm"])
def test_a_budget_stops_an_agent_with_tools(tmp_path, kind):
    with FakeOpenAIServer(reply=tool_server_reply) as server:
        agent, handle = make_agent(kind, server, budget=Budget(max_calls=3))
        try:
            result = AggregatedUpdate(agent, Optimizer(BRAIN), proposals="per_instance", validation="minibatch", final_check=None).train(
                ExactMatchGuide(), [("2+2", "4")], run_dir=tmp_path, progress=False)
        finally:
            handle.close()
        sent = len(server.chat_requests)
    assert sent == 3  # the fourth call was refused before it was sent
    assert result.stopped_reason and "budget" in result.stopped_reason.lower()


def test_uninstrument_litellm_restores_its_functions():
    import litellm

    original = (litellm.completion, litellm.acompletion)
    handle = instrument_litellm()
    with pytest.raises(ValueError, match="already instrumented"):
        instrument_litellm()
    assert (litellm.completion, litellm.acompletion) != original
    uninstrument_litellm()
    assert (litellm.completion, litellm.acompletion) == original
    handle.close()  # closing again changes nothing
    assert (litellm.completion, litellm.acompletion) == original


def test_budget_exceeded_is_raised_by_an_instrumented_client_outside_a_run():
    with FakeOpenAIServer(reply=tool_server_reply) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="test-key")
        handle = instrument(client, budget=Budget(max_calls=1))
        client.chat.completions.create(model="m", messages=QUESTION, tools=TOOLS)
        with pytest.raises(BudgetExceeded):
            client.chat.completions.create(model="m", messages=QUESTION, tools=TOOLS)
        handle.close()


async def test_stop_strings_end_a_reply_that_is_then_complete_not_truncated():
    with FakeOpenAIServer(reply="plausible\nBecause the player ...") as server:
        model = OpenAIModel("m", base_url=server.base_url)
        try:
            completion = await model.complete(QUESTION, stop=["\n"])
        finally:
            model.close()
        assert server.chat_requests[0]["stop"] == ["\n"]
    assert completion.text == "plausible" and not completion.truncated
    scripted = ScriptedModel(["x"])
    await scripted.complete(QUESTION, stop=["."])
    assert scripted.requests[0]["stop"] == ["."]
    with pytest.raises(ValueError, match="1 to 4 non-empty strings"):
        await ScriptedModel(["x"]).complete(QUESTION, stop=[""])
