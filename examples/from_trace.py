"""How Trace's `AggregatedUpdate` code maps onto opto. Runs offline as is.

Trace (opto.trainer.algorithms.aggregator.AggregatedUpdate)      opto
-------------------------------------------------------------      ----------------------------------
node(value, trainable=True) inside a @model class                  Parameter(value) attribute of an Agent
@bundle-decorated method that calls the LLM                        plain (async) code in Agent.forward
OptoPrime(agent.parameters(), llm=llm)                             Optimizer(model)   (one proposal per instance)
AggregatedUpdate(agent=..., optimizer=..., llm=..., max_tokens=)   AggregatedUpdate(agent, optimizer, llm, max_tokens)
alg.train(guide, train_dataset, num_epochs=, batch_size=,          trainer.train(guide, train_dataset, num_epochs=,
          test_dataset=, eval_frequency=, num_threads=)                           batch_size=, test_dataset=,
                                                                                  eval_frequency=)  (+ run_dir=, resume=)
guide.get_feedback(query, response, reference) -> (score, text)    Guide.get_feedback(x, output, info) -> Feedback
{"inputs": [...], "infos": [...]} datasets                         accepted as is (also lists, JSONL files)
alg.forward(agent, x, guide, info) / alg.update(outputs)           same names on opto's AggregatedUpdate

What changes for you: malformed aggregator JSON goes through an extraction chain and
one repair request instead of being dropped; every candidate is type-checked and
validated on the minibatch before it is applied (a tie is rejected); concurrent runs
read parameters through a context variable, so they never mix; `run_dir` gives a
ledger and resume; `Budget` caps calls and cost.
"""

from __future__ import annotations

import json

from opto import Agent, AggregatedUpdate, Feedback, Guide, Optimizer, Parameter
from opto.llm import ScriptedModel

# The agent's own model: answers in digits only when its system prompt says so.
agent_llm = ScriptedModel(
    lambda messages: "4" if "digits" in messages[0]["content"] else "four, I believe", name="agent-llm"
)
# The optimizer and aggregator model: always suggests asking for digits.
optimizer_llm = ScriptedModel(
    lambda messages: json.dumps(
        {"reasoning": "Answers must be bare digits.", "suggestion": {"system_prompt": "Reply with digits only."}}
    ),
    name="optimizer-llm",
)


class Learner(Agent):  # Trace: @model class Learner with self.system_prompt = node(..., trainable=True)
    def __init__(self) -> None:
        self.system_prompt = Parameter("You are a helpful assistant.", description="the agent's system prompt")

    async def forward(self, question: str) -> str:  # Trace: a @bundle method that calls the LLM
        reply = await agent_llm.complete(
            [{"role": "system", "content": self.system_prompt.value}, {"role": "user", "content": question}]
        )
        return reply.text


class DigitGuide(Guide):  # Trace: a guide whose get_feedback returns (score, feedback)
    def get_feedback(self, x, output, info) -> Feedback:
        return Feedback(1.0 if output.strip() == info else 0.0, f"expected {info!r}, got {output!r}")


train_dataset = {"inputs": ["I have two cats and two dogs. How many animals?"] * 4, "infos": ["4"] * 4}

if __name__ == "__main__":
    trainer = AggregatedUpdate(Learner(), Optimizer(optimizer_llm), llm=optimizer_llm, max_tokens=1024)
    result = trainer.train(
        DigitGuide(),
        train_dataset,
        num_epochs=1,
        batch_size=2,
        test_dataset=train_dataset,
        eval_frequency=1,
        progress=False,
    )
    print("test score per evaluation:", result.test_scores)
    print("accepted:", result.accepted, "rejected:", result.rejected)
    print("final parameters:", result.final_parameters)
