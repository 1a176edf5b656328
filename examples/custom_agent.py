"""Train a custom agent with two parameters, a prompt and an int, on BIG-bench sports understanding.

    python examples/custom_agent.py                      # offline, bundled SmolLM2
    python examples/custom_agent.py --model gpt-4o-mini  # OpenAI (OPENAI_API_KEY)
    python examples/custom_agent.py --model NAME --base-url http://127.0.0.1:8000/v1

With --num-proposals 2 the optimizer samples two proposals per instance and each is
scored on its own, which makes preference pairs: see "From prompts to weights" in the
README (`opto export RUN_DIR ...`).
"""

from __future__ import annotations

import argparse
from collections import Counter

from opto import Agent, AggregatedUpdate, Constraint, ExactMatchGuide, Optimizer, Parameter
from opto.datasets import bigbench
from opto.llm import LocalModel, Model, OpenAIModel


def read_verdict(text: str) -> str:
    """The verdict in a free-form reply: "implausible", "plausible", or the reply itself."""
    lowered = text.lower()
    for verdict in ("implausible", "plausible"):  # "implausible" contains "plausible": test it first
        if verdict in lowered:
            return verdict
    return text.strip()


class SportsAgent(Agent):
    """Judges sports statements with an LLM; `votes` samples several verdicts and keeps the most common."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.instructions = Parameter(
            "Answer with one word.",
            description="system prompt of the model that judges the statement",
            constraint=Constraint("plain instructions", max_length=800),
        )
        self.votes = Parameter(
            1,
            description="verdicts sampled per question; the most common one wins",
            constraint=Constraint(min=1, max=5),
        )

    async def forward(self, question: str) -> str:
        messages = [{"role": "system", "content": self.instructions.value}, {"role": "user", "content": question}]
        votes = self.votes.value
        # The verdict is in the first sentence: stop there, so a reply is complete, never cut.
        reply = await self.model.complete(
            messages, n=votes, max_tokens=64, temperature=0.0 if votes == 1 else 0.8, seed=0, stop=["\n", "."]
        )
        return Counter(read_verdict(text) for text in reply.texts).most_common(1)[0][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model on an OpenAI-compatible server (default: local SmolLM2)")
    parser.add_argument("--base-url", help="OpenAI-compatible API root")
    parser.add_argument("--train", type=int, default=12, help="training examples (12 make 10+ preference pairs)")
    parser.add_argument("--test", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=3)
    parser.add_argument("--num-proposals", type=int, default=1, help="proposals per instance (2+ for preference data)")
    parser.add_argument("--run-dir", default="runs/custom_agent")
    parser.add_argument("--resume", action="store_true", help="continue the run in --run-dir")
    args = parser.parse_args()

    model = (
        OpenAIModel(args.model or "default", base_url=args.base_url) if args.model or args.base_url else LocalModel()
    )
    trainer = AggregatedUpdate(
        SportsAgent(model),
        Optimizer(model, num_proposals=args.num_proposals, max_tokens=300, temperature=0.8),
        max_tokens=400,
        concurrency=4,
        score_proposals="instance" if args.num_proposals > 1 else None,
        # Preference pairs come from several proposals for the same instance, each scored.
        proposals="per_instance" if args.num_proposals > 1 else "reflective",
    )
    result = trainer.train(
        ExactMatchGuide(),
        bigbench("sports_understanding", split="train", n=args.train),
        test_dataset=bigbench("sports_understanding", split="test", n=args.test),
        batch_size=args.batch_size,
        eval_frequency=None,
        run_dir=args.run_dir,
        resume=args.resume,
    )
    print(f"test score: {result.initial_test_score} -> {result.final_test_score}")
    print(f"accepted {result.accepted}, rejected {result.rejected}, no update {result.no_update}")
    print(f"calls {result.usage.calls}, tokens {result.usage.total_tokens}")
    print(f"parameters: {result.final_parameters}")
    print(f"run dir: {result.run_dir}")
    model.close()


if __name__ == "__main__":
    main()
