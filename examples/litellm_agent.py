"""An agent written with LiteLLM, optimized by an optimizer that also runs through LiteLLM.

The agent calls `litellm.completion` itself (`acompletion` works the same); `instrument_litellm()` records those calls
in each rollout's trace. The optimizer is opto's `LiteLLMModel`, so any provider LiteLLM
reaches (Anthropic, Gemini, Bedrock, Ollama, ...) can propose the updates; opto's own
rate limits, retries and budget apply to it. Both talk to `FakeOpenAIServer` here,
through LiteLLM's OpenAI-compatible route, so the example runs offline.

    python examples/litellm_agent.py        # offline, a few seconds
"""

from __future__ import annotations

import asyncio
import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: LiteLLM's own price map, no fetch
import litellm  # noqa: E402

from opto import Agent, AggregatedUpdate, ExactMatchGuide, Optimizer, Parameter, aevaluate
from opto.llm import LiteLLMModel, instrument_litellm
from opto.testing import FakeOpenAIServer

REVIEWS = [
    ("A delight from start to finish.", "positive"),
    ("The plot made no sense and the acting was worse.", "negative"),
    ("I would watch it again tomorrow.", "positive"),
    ("Two hours I will never get back.", "negative"),
]


class SentimentAgent(Agent):
    """Labels a review's sentiment with one LiteLLM call."""

    def __init__(self, api_base: str) -> None:
        self.api_base = api_base
        self.instructions = Parameter("What is the sentiment of this review?", description="the system prompt")

    def forward(self, review: str) -> str:  # a plain function: opto runs it in a worker thread
        reply = litellm.completion(
            model="openai/small-model",
            api_base=self.api_base,
            api_key="test-key",
            messages=[{"role": "system", "content": self.instructions.value}, {"role": "user", "content": review}],
        )
        return reply.choices[0].message.content.strip()


def fake_models(request: dict) -> str:
    """Both models: the optimizer proposes terse labels; the agent is terse only when told so."""
    system = request["messages"][0]["content"]
    if "improve the parameters" in system:
        fix = "Reply with one word: positive or negative."
        return json.dumps({"reasoning": "The answers were sentences.", "suggestion": {"instructions": fix}})
    review = request["messages"][-1]["content"]
    label = "positive" if any(w in review for w in ("delight", "again")) else "negative"
    return label if "one word" in system else f"The sentiment of this review is {label}."


async def main() -> None:
    data = [{"x": review, "info": label} for review, label in REVIEWS]
    with FakeOpenAIServer(reply=fake_models) as server:
        handle = instrument_litellm()  # the agent's own litellm calls are traced and counted
        optimizer_model = LiteLLMModel("openai/optimizer-model", api_base=server.base_url, api_key="test-key")
        agent = SentimentAgent(server.base_url)
        before = (await aevaluate(agent, ExactMatchGuide(), data)).mean
        trainer = AggregatedUpdate(agent, Optimizer(optimizer_model), validation=data)
        result = await trainer.atrain(ExactMatchGuide(), data, batch_size=4, progress=False)
        after = (await aevaluate(agent, ExactMatchGuide(), data)).mean
        await optimizer_model.aclose()
        handle.close()
    print(f"accuracy before {before:.2f} after {after:.2f}")
    print(f"instructions: {result.final_parameters['instructions']!r}")
    print(f"calls: agent {result.usage_by_model['small-model'].calls}, optimizer {optimizer_model.usage.calls}")


if __name__ == "__main__":
    asyncio.run(main())
