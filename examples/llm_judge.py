"""An agent with no exact answer to match, judged by an LLM.

The agent writes a title for a news snippet. There is no single right title, so the
guide is `LLMJudgeGuide`: a judge model answers a question about each title and ends
with `Score: N` (out of 10); its reasoning becomes the feedback the optimizer reads. The
judge is an `OpenAIModel` pointed at `FakeOpenAIServer`, which prefers short titles;
swap in a real model name and key to judge for real.

    python examples/llm_judge.py        # offline, a few seconds
"""

from __future__ import annotations

import json

from opto import Agent, AggregatedUpdate, LLMJudgeGuide, OpenAIModel, Optimizer, Parameter, ScriptedModel, evaluate
from opto.testing import FakeOpenAIServer

SNIPPETS = [
    "The city council voted on Tuesday to extend the tram line to the airport by 2029.",
    "A local bakery won the national bread prize for its sourdough, beating 300 entries.",
    "Heavy rain closed the mountain pass for two days; it reopened this morning.",
    "The library will stay open until midnight during the exam weeks in June.",
]


def writer(messages: list[dict]) -> str:
    """The agent's model: wordy unless told to keep titles short."""
    words = messages[-1]["content"].split()
    keep = 5 if "five words" in messages[0]["content"] else 14
    return " ".join(words[:keep]).rstrip(".,;")


def judge(request: dict) -> str:
    """The judge's model: the shorter the title, the higher the score."""
    prompt = request["messages"][-1]["content"]
    title = json.loads(prompt.split("# Output to judge", 1)[1].split("# Question", 1)[0])
    words = len(title.split())
    return f"The title has {words} words; good titles are short. Score: {10 if words <= 5 else 3}"


class TitleAgent(Agent):
    def __init__(self) -> None:
        self.model = ScriptedModel(writer)
        self.instructions = Parameter("Write a title for this news snippet.", description="the system prompt")

    async def forward(self, snippet: str) -> str:
        messages = [{"role": "system", "content": self.instructions.value}, {"role": "user", "content": snippet}]
        return (await self.model.complete(messages)).text


def main() -> None:
    data = [{"x": snippet, "info": None} for snippet in SNIPPETS]
    suggestion = {"instructions": "Write a title of at most five words for this news snippet."}
    brain = ScriptedModel(lambda messages: json.dumps({"reasoning": "Titles run long.", "suggestion": suggestion}))
    with FakeOpenAIServer(reply=judge) as server:
        judge_model = OpenAIModel("judge-model", base_url=server.base_url, api_key="test-key")
        guide = LLMJudgeGuide(judge_model, "Is this a good, short title for the snippet?")
        agent = TitleAgent()
        before = evaluate(agent, guide, data).mean
        result = AggregatedUpdate(agent, Optimizer(brain), validation=data).train(
            guide, data, batch_size=4, progress=False
        )
        after = evaluate(agent, guide, data)
        judge_model.close()
    print(f"judge's mean score before {before:.2f} after {after.mean:.2f}")
    print(f"instructions: {result.final_parameters['instructions']!r}")
    print(f"a title: {after.rollouts[0].output!r}; the judge said: {after.rollouts[0].feedback!r}")


if __name__ == "__main__":
    main()
