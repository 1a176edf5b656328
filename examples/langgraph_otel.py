"""A LangGraph agent, seen through OpenTelemetry, optimized by opto.

The agent is a LangGraph graph (a model node on langchain-openai, a tool node) built
inside `forward`; opto never touches its model client. OpenInference's LangChain
instrumentor emits a span for every model call and tool run, and `trace_otel(provider)`
turns the spans of each rollout into that rollout's trace: the optimizer sees the calls,
the tool calls and the tool results, and the run's usage counts every token. The model
is `FakeOpenAIServer`, which uses the `add` tool only when its system prompt says so.

    python examples/langgraph_otel.py        # offline, a few seconds
"""

from __future__ import annotations

import json
import time

from langchain_core.messages import SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from openinference.instrumentation.langchain import LangChainInstrumentor
from opentelemetry.sdk.trace import TracerProvider

from opto import Agent, AggregatedUpdate, ExactMatchGuide, Optimizer, Parameter, RunDir, ScriptedModel, evaluate
from opto.llm import trace_otel
from opto.testing import FakeOpenAIServer, FakeReply


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class GraphAgent(Agent):
    """A model node that may call `add`, and a tool node, in a loop until the model answers."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.prompt = Parameter("You are a helpful assistant.", description="the agent's system prompt")

    def forward(self, question: str) -> str:
        model = ChatOpenAI(model="fake-model", base_url=self.base_url, api_key="unused").bind_tools([add])

        def call_model(state: MessagesState) -> dict:
            return {"messages": [model.invoke([SystemMessage(self.prompt.value), *state["messages"]])]}

        graph = StateGraph(MessagesState)
        graph.add_node("model", call_model)
        graph.add_node("tools", ToolNode([add]))
        graph.add_edge(START, "model")
        graph.add_conditional_edges("model", tools_condition)
        graph.add_edge("tools", "model")
        final = graph.compile().invoke({"messages": [("user", question)]})
        return str(final["messages"][-1].content)


def fake_model(request: dict) -> object:
    """Answers from the tool's result; calls the tool only when told to use it."""
    messages = request["messages"]
    if messages[-1]["role"] == "tool":
        return str(messages[-1]["content"])
    if "add tool" not in messages[0]["content"]:
        return "I cannot count."
    a, b = (int(n) for n in messages[-1]["content"].rstrip("?").split(" + "))
    return FakeReply("", tool_calls=[{"name": "add", "arguments": {"a": a, "b": b}}])


def main() -> None:
    run_dir = time.strftime("runs/langgraph-%Y%m%d-%H%M%S")
    provider = TracerProvider()
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=provider)  # the framework's instrumentor makes the spans
    tracing = trace_otel(provider)  # opto reads them
    brain = ScriptedModel(
        lambda messages: json.dumps(
            {"reasoning": "It never used its tool.", "suggestion": {"prompt": "Always use the add tool for sums."}}
        )
    )
    data = [{"x": f"{a} + {b}?", "info": str(a + b)} for a, b in ((2, 3), (4, 1), (5, 5), (1, 1))]
    try:
        with FakeOpenAIServer(reply=fake_model) as server:
            agent = GraphAgent(server.base_url)
            before = evaluate(agent, ExactMatchGuide(), data).mean
            trainer = AggregatedUpdate(agent, Optimizer(brain), validation=data)
            result = trainer.train(ExactMatchGuide(), data, batch_size=4, run_dir=run_dir, progress=False)
            after = evaluate(agent, ExactMatchGuide(), data).mean
    finally:
        tracing.close()
        instrumentor.uninstrument()
    best = max(RunDir(run_dir).events("rollout"), key=lambda rollout: rollout.score or 0.0)
    kinds = ["tool: " + step["tool_result"]["name"] if "tool_result" in step else "model call" for step in best.trace]
    print(f"accuracy before {before:.2f} after {after:.2f}")
    print(f"prompt: {result.final_parameters['prompt']!r}")
    print(f"a rollout's trace, as the optimizer sees it: {kinds}")
    print(f"run dir: {run_dir} (see it with: opto report {run_dir} --html)")


if __name__ == "__main__":
    main()
