"""OpenTelemetry LLM spans as rollout calls (`opto.llm.otel`), with the real instrumentors
(OpenInference for the OpenAI SDK and LiteLLM, OpenTelemetry's openai-v2) against
FakeOpenAIServer."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any

import openai
import pytest

pytest.importorskip("opentelemetry.sdk", reason="the `otel` extra is part of the test install")
from opentelemetry import context as otel_context  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402

from opto import Agent, Budget, ExactMatchGuide, Example, Parameter  # noqa: E402
from opto.llm.errors import BudgetExceeded  # noqa: E402
from opto.llm.instrument import instrument  # noqa: E402
from opto.llm.otel import trace_otel  # noqa: E402
from opto.llm.usage import budget_scope, meter_usage  # noqa: E402
from opto.core.rollout import run_rollout  # noqa: E402
from opto.testing import FakeOpenAIServer, FakeReply  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "add", "description": "adds",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]


def reply(request: dict[str, Any]) -> Any:
    """Asks for the tool first, answers once the tool result is in the conversation."""
    if any(m.get("role") == "tool" for m in request["messages"]):
        return "4"
    return FakeReply("", tool_calls=[{"name": "add", "arguments": {"a": 2}}])


@pytest.fixture
def server():
    with FakeOpenAIServer(reply) as running:
        yield running


@pytest.fixture
def provider():
    made = TracerProvider()
    yield made
    made.shutdown()


@pytest.fixture
def openinference_openai(provider):
    from openinference.instrumentation.openai import OpenAIInstrumentor

    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    yield provider
    instrumentor.uninstrument()


class ToolAgent(Agent):
    """A plain OpenAI SDK agent with one tool: the call, the tool, the answer."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.prompt = Parameter("Use the tool.", description="the system prompt")

    def forward(self, x: str) -> str:
        client = openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0)
        messages: list[Any] = [{"role": "system", "content": self.prompt.value}, {"role": "user", "content": x}]
        first = client.chat.completions.create(model="fake-model", messages=messages, tools=TOOLS)
        call = first.choices[0].message.tool_calls[0]
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "4"}]
        return client.chat.completions.create(model="fake-model", messages=messages, tools=TOOLS).choices[0].message.content


def rollout(agent: Agent, x: str = "2 + 2?") -> Any:
    return asyncio.run(run_rollout(agent, ExactMatchGuide(), Example(x=x, info="4", id="q")))


def test_openinference_spans_of_the_openai_sdk_are_the_rollouts_calls(openinference_openai, server):
    handle = trace_otel(openinference_openai)
    with meter_usage() as meter:
        found = rollout(ToolAgent(server.base_url))
    handle.close()
    assert found.score == 1.0 and [c["model"] for c in found.trace] == ["fake-model", "fake-model"]
    first, second = found.trace
    assert first["messages"] == [{"role": "system", "content": "Use the tool."}, {"role": "user", "content": "2 + 2?"}]
    assert first["tool_calls"][0]["name"] == "add" and json.loads(first["tool_calls"][0]["arguments"]) == {"a": 2}
    assert first["tools"] == TOOLS and second["response"] == "4"
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
    assert meter.total.calls == 2 == len(server.chat_requests)
    assert meter.total.prompt_tokens > 0  # the spans' token counts, as the server reported them


def test_genai_semconv_spans_of_openai_v2_are_the_rollouts_calls(provider, server, monkeypatch):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    handle = trace_otel(provider)
    try:
        with meter_usage() as meter:
            found = rollout(ToolAgent(server.base_url))
    finally:
        handle.close()
        instrumentor.uninstrument()
    assert found.score == 1.0 and len(found.trace) == 2
    assert found.trace[0]["messages"][1] == {"role": "user", "content": "2 + 2?"}
    assert found.trace[0]["tool_calls"][0]["name"] == "add" and found.trace[1]["response"] == "4"
    assert found.trace[1]["messages"][-1]["role"] == "tool"
    assert meter.total.calls == 2


def test_litellm_spans_count_once_and_opto_s_own_calls_are_not_counted_again(provider, server):
    from openinference.instrumentation.litellm import LiteLLMInstrumentor

    import litellm

    from opto.llm import LiteLLMModel

    class LiteAgent(Agent):
        def __init__(self) -> None:
            self.prompt = Parameter("Say 4.")
            self.model = LiteLLMModel("openai/fake-model", api_base=server.base_url, api_key="unused", max_retries=0)

        async def forward(self, x: str) -> str:
            direct = litellm.completion(model="openai/fake-model", api_base=server.base_url, api_key="unused",
                                        messages=[{"role": "user", "content": self.prompt.value},
                                                  {"role": "tool", "tool_call_id": "t", "content": "4"}])
            own = await self.model.complete([{"role": "user", "content": direct.choices[0].message.content}])
            return own.text

    instrumentor = LiteLLMInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    handle = trace_otel(provider)
    agent = LiteAgent()
    try:
        with meter_usage() as meter:
            found = rollout(agent)
    finally:
        handle.close()
        instrumentor.uninstrument()
        agent.model.close()
    assert len(server.chat_requests) == 2
    assert len(found.trace) == 2  # one from the span of litellm.completion, one from opto's LiteLLMModel
    assert {c.get("source") for c in found.trace} == {"opentelemetry", None}
    assert meter.total.calls == 2 and handle.skipped >= 1  # the span of opto's own call was left out


def test_an_instrumented_client_and_an_instrumentor_count_each_call_once(openinference_openai, server):
    class Both(ToolAgent):
        def forward(self, x: str) -> str:
            client = openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0)
            instrument(client)
            return client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": x}],
                                                  ).choices[0].message.content or ""

    handle = trace_otel(openinference_openai)
    with meter_usage() as meter:
        found = rollout(Both(server.base_url))
    handle.close()
    assert len(found.trace) == 1 and "source" not in found.trace[0] and meter.total.calls == 1


def test_a_span_from_a_thread_the_framework_made_belongs_to_the_rollout_of_its_parent(openinference_openai, server):
    tracer = openinference_openai.get_tracer("framework")

    class Threaded(ToolAgent):
        async def forward(self, x: str) -> str:
            answers: list[str] = []
            with tracer.start_as_current_span("chain", attributes={"openinference.span.kind": "CHAIN"}):
                carried = otel_context.get_current()  # what frameworks pass to their threads; not opto's context

                def work() -> None:
                    token = otel_context.attach(carried)
                    try:
                        client = openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0)
                        answers.append(client.chat.completions.create(
                            model="fake-model", messages=[{"role": "user", "content": x}]).choices[0].message.content)
                    finally:
                        otel_context.detach(token)

                thread = threading.Thread(target=work)
                thread.start()
                thread.join()
            return answers[0] or ""

    handle = trace_otel(openinference_openai)
    found = rollout(Threaded(server.base_url))
    handle.close()
    assert [c["model"] for c in found.trace] == ["fake-model"]


def test_tool_spans_become_tool_results_and_spans_outside_a_rollout_count_in_usage_only(provider):
    tracer = provider.get_tracer("framework")

    class UsesATool(Agent):
        def __init__(self) -> None:
            self.p = Parameter("x")

        def forward(self, x: str) -> str:
            with tracer.start_as_current_span("add", attributes={"openinference.span.kind": "TOOL", "tool.name": "add",
                                                                "input.value": '{"a": 2}', "output.value": "4"}):
                return "4"

    handle = trace_otel(provider)
    found = rollout(UsesATool())
    with meter_usage() as meter:  # an LLM span outside any rollout
        with tracer.start_as_current_span("chat", attributes={"gen_ai.operation.name": "chat",
                                                             "gen_ai.request.model": "fake-model",
                                                             "gen_ai.usage.input_tokens": 5,
                                                             "gen_ai.usage.output_tokens": 2}):
            pass
    handle.close()
    assert found.trace == [{"tool_result": {"name": "add", "tool_call_id": "", "content": "4", "input": '{"a": 2}'}}]
    assert meter.total.calls == 1 and meter.total.prompt_tokens == 5


def test_a_malformed_span_is_skipped_with_a_warning(provider, caplog):
    tracer = provider.get_tracer("framework")
    handle = trace_otel(provider)
    with caplog.at_level(logging.WARNING, logger="opto.llm.otel"):
        with meter_usage() as meter:
            for attributes in ({"openinference.span.kind": "LLM"},  # no model
                               {"openinference.span.kind": "LLM", "llm.model_name": "m",
                                "llm.input_messages.0.message.content": "no role"},
                               {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                                "gen_ai.input.messages": "{not json"}):
                with tracer.start_as_current_span("bad", attributes=attributes):
                    pass
    handle.close()
    assert handle.skipped == 3 and meter.total.calls == 0
    assert sum("could not read" in r.getMessage() for r in caplog.records) >= 1


def test_closing_restores_the_providers_processors_exactly(provider):
    before = provider._active_span_processor._span_processors
    handle = trace_otel(provider)
    assert len(provider._active_span_processor._span_processors) == len(before) + 1
    handle.close()
    assert provider._active_span_processor._span_processors == before


def test_a_run_budget_used_up_by_spans_stops_at_the_end_of_the_rollout(openinference_openai, server):
    handle = trace_otel(openinference_openai)
    budget = Budget(max_calls=3)
    with budget_scope(budget):
        first = rollout(ToolAgent(server.base_url))  # two calls: one left
        with pytest.raises(BudgetExceeded, match="3 calls is used up"):
            rollout(ToolAgent(server.base_url))  # the third call was already made when the span ended
    handle.close()
    assert first.score == 1.0 and budget.calls == 4 and len(server.chat_requests) == 4


def test_trace_otel_needs_an_sdk_provider():
    from opentelemetry.trace import NoOpTracerProvider

    with pytest.raises(TypeError, match="SDK TracerProvider"):
        trace_otel(NoOpTracerProvider())


# ------------------------------------------------------------------ a LangGraph agent, trained


def calculator_server_reply(request: dict[str, Any]) -> Any:
    """A model that uses the add tool only when its system prompt says so."""
    messages = request["messages"]
    system = next((m["content"] for m in messages if m["role"] == "system"), "")
    tool_results = [m for m in messages if m["role"] == "tool"]
    if tool_results:
        return str(tool_results[-1]["content"])
    if "add tool" not in system:
        return "I cannot count."
    a, b = (int(n) for n in messages[-1]["content"].rstrip("?").split(" + "))
    return FakeReply("", tool_calls=[{"name": "add", "arguments": {"a": a, "b": b}}])


class GraphAgent(Agent):
    """A LangGraph ReAct agent on langchain-openai with one tool, made inside forward."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.prompt = Parameter("You are a helpful assistant.", description="the agent's system prompt")

    def forward(self, question: str) -> str:
        from langchain_core.tools import tool
        from langchain_openai import ChatOpenAI
        from langgraph.prebuilt import create_react_agent

        @tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        model = ChatOpenAI(model="fake-model", base_url=self.base_url, api_key="unused", max_retries=0)
        graph = create_react_agent(model, [add], prompt=self.prompt.value)
        return str(graph.invoke({"messages": [("user", question)]})["messages"][-1].content)


@pytest.fixture
def langchain_traced(provider):
    pytest.importorskip("langgraph", reason="the `otel` test install brings LangGraph")
    from openinference.instrumentation.langchain import LangChainInstrumentor

    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    handle = trace_otel(provider)
    yield handle
    handle.close()
    instrumentor.uninstrument()


def langgraph_trainer(base_url: str) -> tuple[Any, Any]:
    from opto import AggregatedUpdate, Optimizer, ScriptedModel

    brain = ScriptedModel(lambda messages: json.dumps(
        {"reasoning": "it never used its tool", "suggestion": {"prompt": "Always use the add tool for sums."}}),
        name="brain")
    return AggregatedUpdate(GraphAgent(base_url), Optimizer(brain), llm=brain, proposals="per_instance", validation="minibatch", final_check=None), brain


def test_a_langgraph_agent_is_trained_with_every_call_and_tool_in_its_ledger(langchain_traced, tmp_path):
    from opto import RunDir, evaluate

    data = [{"x": f"{a} + {b}?", "info": str(a + b), "id": f"q{a}{b}"} for a, b in ((2, 3), (4, 1), (5, 5), (1, 1))]
    with FakeOpenAIServer(calculator_server_reply) as server:
        trainer, brain = langgraph_trainer(server.base_url)
        before = evaluate(trainer.agent, ExactMatchGuide(), data).mean
        first = len(server.chat_requests)
        result = trainer.train(ExactMatchGuide(), data, batch_size=2, run_dir=tmp_path, progress=False, shuffle=False)
        served = len(server.chat_requests) - first  # the training run's requests
        after = evaluate(trainer.agent, ExactMatchGuide(), data).mean
    assert before == 0.0 and after == 1.0 and result.accepted >= 1
    rollouts = list(RunDir(tmp_path).events("rollout"))
    for found in rollouts:
        calls = [c for c in found.trace if "model" in c]
        tools = [c["tool_result"] for c in found.trace if "tool_result" in c]
        if found.score == 1.0:  # the prompt that says so: call, tool, answer
            assert len(calls) == 2 and calls[0]["tool_calls"][0]["name"] == "add"
            assert tools and tools[0]["name"] == "add" and tools[0]["content"] == found.info
        else:
            assert len(calls) == 1 and not tools
    agent_calls = sum(1 for found in rollouts for c in found.trace if "model" in c)
    assert agent_calls == served  # every request the server saw is in the ledger, once
    assert result.usage_by_model["fake-model"].calls == served
    shown = [request["messages"][-1]["content"] for request in brain.requests]
    assert "## Call 1 (fake-model" in shown[0] and "[reply] I cannot count." in shown[0]
    # after the accepted step the optimizer sees the tool call and its result too
    assert any("## Tool result (add" in text and "[input]" in text and "[tool calls]" in text for text in shown)


def test_a_budget_stops_a_langgraph_run(langchain_traced, tmp_path):
    data = [{"x": f"{a} + 1?", "info": str(a + 1), "id": f"q{a}"} for a in range(6)]
    with FakeOpenAIServer(calculator_server_reply) as server:
        trainer, _ = langgraph_trainer(server.base_url)
        budget = Budget(max_calls=8)
        result = trainer.train(ExactMatchGuide(), data, batch_size=2, run_dir=tmp_path, progress=False,
                               shuffle=False, budget=budget)
    assert result.stopped_reason is not None and result.stopped_reason.startswith("budget exceeded")
    assert result.steps < 3 and budget.calls >= 8


def test_a_handle_that_saw_no_span_says_it_was_attached_where_nothing_writes(caplog):
    watched, elsewhere = TracerProvider(), TracerProvider()
    handle = trace_otel(watched)
    with elsewhere.get_tracer("app").start_as_current_span("chat gpt-4o-mini"):  # another provider: unseen
        pass
    with caplog.at_level(logging.WARNING, logger="opto.llm.otel"):
        handle.close()
    assert handle.spans_seen == 0 and "saw no span on its TracerProvider" in caplog.text
    caplog.clear()
    seen = trace_otel(watched)
    with watched.get_tracer("app").start_as_current_span("a span"):
        pass
    with caplog.at_level(logging.WARNING, logger="opto.llm.otel"):
        seen.close()
    assert seen.spans_seen == 1 and "saw no span" not in caplog.text
