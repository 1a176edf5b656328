"""Text and numbers tuned together: an LLM optimizer for the prompt, TPE for the knobs.

A retrieval agent has a text parameter (its instructions) and a numeric one (how many
passages it retrieves). An LLM is good at rewriting instructions from feedback and poor
at guessing numbers; a Tree-structured Parzen
Estimator (`TPEProposer`, Optuna) learns from every validation score where the good
numbers lie. Both are proposers of one `AggregatedUpdate`; each step's candidates are
validated like any other. Numbers need `Constraint(min=, max=)`.

    python examples/numeric_and_text.py        # offline, a few seconds (needs the tpe extra)
"""

from __future__ import annotations

import json

from opto import Agent, AggregatedUpdate, Constraint, Feedback, Guide, Optimizer, Parameter, ScriptedModel, TPEProposer

# A tiny corpus: each question's answer sits in its fourth-best passage.
FACTS = {
    "capital of Norway": "Oslo",
    "largest planet": "Jupiter",
    "author of Emma": "Austen",
    "metal in bronze besides copper": "tin",
    "longest river in France": "Loire",
    "painter of the Night Watch": "Rembrandt",
}


def retrieve(question: str, k: int) -> list[str]:
    """Ranked passages: three near misses, then the one that answers."""
    return [f"note {i} on the {question}" for i in range(3)] + [f"The {question} is {FACTS[question]}."][
        : max(0, k - 3)
    ]


def reader(messages: list[dict]) -> str:
    """The agent's model: answers in one word only when asked to, from the passages it got."""
    system, passages = messages[0]["content"], messages[1]["content"]
    found = next((line.split(" is ")[-1].rstrip(".") for line in passages.splitlines() if " is " in line), None)
    if found is None:
        return "I am not sure."
    return found if "one word" in system else f"According to the passages, it is {found}."


class AnswerGuide(Guide):
    """1 for the answer alone, 0.5 for a reply that contains it, 0 otherwise."""

    def get_feedback(self, x: str, output: str, info: str) -> Feedback:
        if output.strip().rstrip(".") == info:
            return Feedback(score=1.0, feedback="Correct.")
        if info in output:
            return Feedback(score=0.5, feedback=f"The answer {info!r} is there, but give only the answer.")
        return Feedback(score=0.0, feedback=f"Expected {info!r}; the reply did not contain it.")


class RetrievalAgent(Agent):
    def __init__(self) -> None:
        self.model = ScriptedModel(reader, name="reader")
        self.instructions = Parameter("Answer the question.", description="the reader's system prompt")
        self.top_k = Parameter(2, description="passages retrieved", constraint=Constraint(min=1, max=8))

    async def forward(self, question: str) -> str:
        passages = "\n".join(retrieve(question, self.top_k.value))
        messages = [
            {"role": "system", "content": self.instructions.value},
            {"role": "user", "content": f"{passages}\n\nQuestion: {question}"},
        ]
        return (await self.model.complete(messages)).text


def main() -> None:
    data = [{"x": question, "info": answer} for question, answer in FACTS.items()]
    rewrite = {"instructions": "Answer with one word taken from the passages."}
    brain = ScriptedModel(lambda messages: json.dumps({"reasoning": "Answers were sentences.", "suggestion": rewrite}))
    proposers = [Optimizer(brain), TPEProposer(["top_k"], seed=0, n_startup_trials=3)]
    trainer = AggregatedUpdate(RetrievalAgent(), proposers, llm=brain, validation=data, candidates="each")
    result = trainer.train(AnswerGuide(), data, batch_size=3, num_epochs=4, test_dataset=data, progress=False)
    values = result.final_parameters
    print(f"mean score before {result.initial_test_score:.2f} after {result.final_test_score:.2f}")
    print(f"instructions: {values['instructions']!r}  top_k: {values['top_k']}")
    print(f"steps: {result.steps}  accepted: {result.accepted}")


if __name__ == "__main__":
    main()
