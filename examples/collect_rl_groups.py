"""Collecting RL data: sample the agent several times per example, judge each, group them.

`collect` runs the agent `samples` times on every example, at a sampling temperature and
with seed `seed + k` for sample k, judges each rollout with the guide and writes them to
a run directory's ledger, resumably. Rollouts of one example form a group: their rewards
relative to each other are what GRPO learns from. `read_groups` reads them back (groups
whose rewards are all equal teach nothing and are dropped) and `export_run(...,
format="art")` writes them for a trainer (ART, or opto's own TRL GRPO adapter).

The model is `FakeOpenAIServer`, which gets the sum right for some seeds only.

    python examples/collect_rl_groups.py        # offline, a few seconds
"""

from __future__ import annotations

import time
from pathlib import Path

from opto import Agent, ExactMatchGuide, OpenAIModel, Parameter, collect
from opto.preference import export_run, read_groups
from opto.testing import FakeOpenAIServer


class Adder(Agent):
    def __init__(self, llm: OpenAIModel) -> None:
        self.llm = llm
        self.prompt = Parameter("Reply with the sum only.", description="system prompt")

    async def forward(self, question: str) -> str:
        messages = [{"role": "system", "content": self.prompt.value}, {"role": "user", "content": question}]
        # logprobs make the groups on-policy data: what the policy sampled, and how likely it was
        reply = await self.llm.complete(messages, logprobs=True)
        return reply.text.strip()


def sampled_model(request: dict) -> str:
    """Right for two seeds in three, off by one otherwise: a policy with something to learn."""
    a, b = (int(n) for n in request["messages"][-1]["content"].rstrip("?").split(" + "))
    return str(a + b) if request.get("seed", 0) % 3 else str(a + b + 1)


def main() -> None:
    run_dir = Path(time.strftime("runs/collect-%Y%m%d-%H%M%S"))
    data = [{"x": f"{a} + {b}?", "info": str(a + b)} for a, b in ((2, 3), (10, 7), (4, 4), (21, 21), (6, 1))]
    with FakeOpenAIServer(reply=sampled_model) as server:
        llm = OpenAIModel("policy-model", base_url=server.base_url, api_key="test-key")
        result = collect(Adder(llm), ExactMatchGuide(), data, samples=3, temperature=1.0, seed=0, run_dir=run_dir,
                         progress=False)  # fmt: skip
        llm.close()
    reading = read_groups(run_dir)
    report = export_run(run_dir, run_dir / "groups.jsonl", format="art")
    rewards = [[trajectory.reward for trajectory in group.trajectories] for group in reading.groups]
    print(f"rollouts: {result.rollouts} ({result.examples} examples x {result.samples} samples), "
          f"mean score {result.mean_score:.2f}")  # fmt: skip
    print(f"groups kept: {len(reading.groups)}, rewards per group: {rewards}")
    print(f"written for GRPO: {report.records} groups to {report.out}")


if __name__ == "__main__":
    main()
