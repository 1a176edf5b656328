"""An agent written with the OpenAI SDK that calls a tool, optimized by opto.

The agent is plain `openai.AsyncOpenAI` code: it offers a calculator tool, runs the tool
calls the model makes and sends the results back. `instrument(client)` records each call
in the rollout's trace (messages, tool calls, the tools offered) and `tool_result(...)`
records each tool's result, so the optimizer sees the whole conversation. The model is
`FakeOpenAIServer` on 127.0.0.1, scripted to use the tool only when its system prompt
tells it to: the optimizer has to find that out from the failures.

    python examples/openai_sdk_tools.py        # offline, a few seconds
"""

from __future__ import annotations

import asyncio
import json

import openai

from opto import Agent, AggregatedUpdate, ExactMatchGuide, Optimizer, Parameter, ScriptedModel, aevaluate
from opto.llm import instrument, tool_result
from opto.testing import FakeOpenAIServer, FakeReply

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "multiply",
        "description": "Multiply two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}


class CalculatorAgent(Agent):
    """Answers multiplication questions with the OpenAI SDK and a tool."""

    def __init__(self, client: openai.AsyncOpenAI) -> None:
        self.client = client
        self.instructions = Parameter("You are a helpful assistant.", description="the system prompt")

    async def forward(self, question: str) -> str:
        messages = [{"role": "system", "content": self.instructions.value}, {"role": "user", "content": question}]
        for _ in range(3):  # a few tool rounds at most
            reply = await self.client.chat.completions.create(
                model="gpt-4o-mini", messages=messages, tools=[CALCULATOR]
            )
            message = reply.choices[0].message
            if not message.tool_calls:
                return (message.content or "").strip()
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                arguments = json.loads(call.function.arguments)
                messages.append(tool_result(call, arguments["a"] * arguments["b"]))
        return ""


def fake_model(request: dict) -> object:
    """Guesses unless its instructions mention the tool; then calls it and reports the result."""
    messages = request["messages"]
    if messages[-1]["role"] == "tool":
        return str(messages[-1]["content"])
    if "multiply tool" not in messages[0]["content"]:
        return "About a hundred."
    a, b = (int(n) for n in messages[-1]["content"].removeprefix("What is ").rstrip("?").split(" times "))
    return FakeReply("", tool_calls=[{"name": "multiply", "arguments": {"a": a, "b": b}}])


async def main() -> None:
    data = [{"x": f"What is {a} times {b}?", "info": str(a * b)} for a, b in ((12, 13), (7, 8), (21, 3), (9, 11))]
    # The optimizer's model, scripted here; any opto model (OpenAIModel, ...) works the same.
    optimizer_model = ScriptedModel(
        lambda messages: json.dumps(
            {"reasoning": "It guessed instead of computing.", "suggestion": {"instructions": "Use the multiply tool."}}
        )
    )
    with FakeOpenAIServer(reply=fake_model) as server:
        # One event loop for the whole run: an async SDK client belongs to the loop it first ran on.
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test-key")
        handle = instrument(client)  # every call inside a rollout is traced and counted
        agent = CalculatorAgent(client)
        before = (await aevaluate(agent, ExactMatchGuide(), data)).mean
        trainer = AggregatedUpdate(agent, Optimizer(optimizer_model), validation=data)
        result = await trainer.atrain(ExactMatchGuide(), data, batch_size=4, progress=False)
        after = (await aevaluate(agent, ExactMatchGuide(), data)).mean
        handle.close()
        await client.close()
    print(f"accuracy before {before:.2f} after {after:.2f}")
    print(f"instructions: {result.final_parameters['instructions']!r}")
    print(f"agent calls during training: {result.usage_by_model['gpt-4o-mini'].calls}")


if __name__ == "__main__":
    asyncio.run(main())
