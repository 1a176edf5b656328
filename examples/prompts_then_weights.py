"""From prompts to weights: optimize a prompt, turn the run into DPO pairs, fine-tune, switch.

1. Train the prompt, asking for two proposals per instance and scoring each on its own
   instance, so the ledger holds better and worse proposals for the same input.
2. `export_run` turns the ledger into OpenAI DPO pairs (`opto export` on the command line).
3. `OpenAIFineTuneAdapter` uploads them and starts a fine-tuning job (the same call works
   on OpenAI; NeMo Customizer, TRL and ART have adapters of the same shape).
4. `switch_model` points the agent's model at the fine-tuned model, and records it in the
   run directory, so a resumed run keeps asking the tuned model.

Everything runs against `FakeOpenAIServer`, whose fine-tuned model answers in digits
unprompted. For real weights trained here, on the CPU, see `opto demo --finetune sft`.

    python examples/prompts_then_weights.py        # offline, a few seconds
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from opto import Agent, AggregatedUpdate, Aggregator, ExactMatchGuide, OpenAIModel, Optimizer, Parameter, evaluate
from opto.finetune import OpenAIFineTuneAdapter, switch_model
from opto.preference import export_run
from opto.testing import FakeOpenAIServer

NUMBERS = {
    "a dozen": "12", "a score": "20", "a pair": "2", "a gross": "144", "half a dozen": "6", "a baker's dozen": "13",
    "a brace": "2", "a trio": "3", "a quartet": "4", "a century": "100", "a fortnight in days": "14", "a myriad": "10000",
}  # fmt: skip


class Counter(Agent):
    def __init__(self, llm: OpenAIModel) -> None:
        self.llm = llm  # an attribute, so switch_model can point it at the tuned model
        self.prompt = Parameter("How many is this?", description="system prompt")

    async def forward(self, phrase: str) -> str:
        reply = await self.llm.complete(
            [{"role": "system", "content": self.prompt.value}, {"role": "user", "content": phrase}]
        )
        return reply.text.strip()


def fake_models(request: dict) -> object:
    """The optimizer proposes two different prompts; the base model needs the digits prompt;
    a fine-tuned model (its name starts with "ft:") answers in digits unprompted."""
    system = request["messages"][0]["content"]
    if "improve the parameters" in system or "merge several suggested updates" in system:
        prompts = ["Reply with the number in digits.", "Think about it."] * 2
        return [json.dumps({"reasoning": "r", "suggestion": {"prompt": p}}) for p in prompts[: request.get("n") or 1]]
    number = NUMBERS.get(request["messages"][-1]["content"], "?")
    return number if "digits" in system or request["model"].startswith("ft:") else f"It is {number} things."


def main() -> None:
    run_dir = Path(time.strftime("runs/weights-%Y%m%d-%H%M%S"))
    data = [{"x": phrase, "info": number} for phrase, number in NUMBERS.items()]
    with FakeOpenAIServer(reply=fake_models) as server:
        server.job_script = ["running", "succeeded"]
        llm = OpenAIModel("gpt-4.1-mini-2025-04-14", base_url=server.base_url, api_key="test-key")
        agent = Counter(llm)
        # 1. prompts
        trainer = AggregatedUpdate(
            agent, Optimizer(llm, num_proposals=2), aggregator=Aggregator(llm, num_candidates=2),
            score_proposals="instance", validation=data,
        )  # fmt: skip
        trainer.train(ExactMatchGuide(), data, batch_size=4, run_dir=run_dir, progress=False)
        prompted = evaluate(agent, ExactMatchGuide(), data).mean
        # 2. preference pairs from the ledger
        report = export_run(run_dir, run_dir / "pairs.jsonl", format="openai-dpo")
        # 3. fine-tune on them
        adapter = OpenAIFineTuneAdapter(llm.name, method="dpo", base_url=server.base_url, api_key="test-key")
        job = asyncio.run(adapter.submit(run_dir / "pairs.jsonl"))
        final = asyncio.run(adapter.wait_until_complete(job, poll_interval=0.05))
        # 4. switch the agent to the tuned model, and drop the prompt it no longer needs
        switch_model(agent, final, run_dir=run_dir)
        agent.prompt.value = "How many is this?"
        tuned = evaluate(agent, ExactMatchGuide(), data).mean
        llm.close()
    print(f"accuracy with the optimized prompt {prompted:.2f}")
    print(f"preference pairs exported: {report.records}; fine-tuning job {final.status}: {final.fine_tuned_model}")
    print(f"accuracy of the tuned model with the original prompt {tuned:.2f}")
    print(f"run dir: {run_dir}")


if __name__ == "__main__":
    main()
