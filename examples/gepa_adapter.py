"""GEPA adapters optimized by opto's search: GEPA's own DefaultAdapter, and a small one.

`opto.integrations.gepa.optimize(seed_candidate, trainset, valset, adapter, reflection_lm=...)`
is `gepa.optimize`'s own call: it takes any `GEPAAdapter` and runs it under opto's trainer: each
component is a text parameter, the adapter's `evaluate` gives the scores and its
`make_reflective_dataset` the feedback the optimizer is shown. The result has GEPA's
`best_candidate` beside opto's `TrainResult`, and the run directory its ledger.

1. GEPA's `DefaultAdapter` (a system prompt; an answer counts when it contains the expected
   one), its task model a function that calls `FakeOpenAIServer` through LiteLLM.
2. A two-component adapter written here: `facts` and `style` must both be right.

Both optimizers are opto `OpenAIModel`s on the same fake server, so it runs offline.

    pip install "opto-agents[gepa]"
    python examples/gepa_adapter.py         # offline, a few seconds
"""

from __future__ import annotations

import json
import os
import re

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: LiteLLM's own price map, no fetch
import litellm  # noqa: E402
from gepa.adapters.default_adapter.default_adapter import DefaultAdapter  # noqa: E402
from gepa.core.adapter import EvaluationBatch  # noqa: E402

from opto.integrations.gepa import optimize  # noqa: E402
from opto.llm import OpenAIModel  # noqa: E402
from opto.testing import FakeOpenAIServer  # noqa: E402

CAPITALS = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Peru": "Lima", "Japan": "Tokyo", "Kenya": "Nairobi"}


def fake_models(request: dict) -> str:
    """The task model names the capital only when its system prompt asks for one; the
    optimizer asks for it, and for the countries and style the small adapter needs."""
    system, last = request["messages"][0]["content"], request["messages"][-1]["content"]
    if "improve the parameters" in system:
        if "## system_prompt" in last:
            return json.dumps({"reasoning": "say what to answer", "suggestion": {"system_prompt": "Name the capital."}})
        missing = sorted(set(re.findall(r"Inputs: (\w+)\nGenerated Outputs: unknown", last)))
        facts = json.loads(re.search(r"## facts.*?- current value: (\".*?\")\n", last, re.S).group(1))
        return json.dumps(
            {
                "reasoning": "add the missing countries; one word",
                "suggestion": {"facts": " ".join([facts, *missing]).strip(), "style": "one word"},
            }
        )
    country = last.rsplit(" ", 1)[-1].rstrip("?")
    return f"It is {CAPITALS[country]}." if "capital" in system else "I am not sure."


class FactsAdapter:
    """Answers right only for the countries `facts` names, and only when `style` says one word."""

    def evaluate(self, batch: list[dict], candidate: dict[str, str], capture_traces: bool = False) -> EvaluationBatch:
        outputs = [CAPITALS[d["country"]] if d["country"] in candidate["facts"] else "unknown" for d in batch]
        scores = [float(out != "unknown" and "one word" in candidate["style"]) for out in outputs]
        traces = [{"data": d, "output": out, "score": s} for d, out, s in zip(batch, outputs, scores)]
        return EvaluationBatch(outputs=outputs, scores=scores, trajectories=traces if capture_traces else None)

    def make_reflective_dataset(self, candidate: dict[str, str], eval_batch: EvaluationBatch, components: list[str]):
        records = [
            {
                "Inputs": t["data"]["country"],
                "Generated Outputs": t["output"],
                "Feedback": "right" if t["score"] else f"expected {CAPITALS[t['data']['country']]}, in one word",
            }
            for t in eval_batch.trajectories
        ]
        return {name: records for name in components}


def main() -> None:
    countries = list(CAPITALS)
    with FakeOpenAIServer(reply=fake_models) as server:

        def task_model(messages: list[dict]) -> str:  # what DefaultAdapter calls: messages in, text out
            reply = litellm.completion(
                model="openai/task-model", api_base=server.base_url, api_key="test-key", messages=messages
            )
            return reply.choices[0].message.content

        questions = [
            {"input": f"What is the capital of {c}?", "additional_context": {}, "answer": CAPITALS[c]}
            for c in countries
        ]
        default = DefaultAdapter(model=task_model)
        seed = {"system_prompt": "Answer the question."}
        optimizer = OpenAIModel("optimizer", base_url=server.base_url, api_key="test-key")
        found = optimize(
            seed,
            questions[:4],
            questions[4:],
            default,
            reflection_lm=optimizer,
            reflection_minibatch_size=2,
            max_metric_calls=60,
            run_dir="runs/gepa-default",
        )
        before = sum(default.evaluate(questions, seed).scores) / len(questions)
        after = sum(default.evaluate(questions, found.best_candidate).scores) / len(questions)
        print(f"DefaultAdapter: accuracy before {before:.2f} after {after:.2f}")
        print(f"best_candidate: {found.best_candidate}")

        small = FactsAdapter()
        data = [{"country": c} for c in countries]
        seed = {"facts": "Known:", "style": "a full sentence"}
        found = optimize(
            seed,
            data[:4],
            data,
            small,
            reflection_lm=optimizer,
            reflection_minibatch_size=2,
            max_metric_calls=80,
            run_dir="runs/gepa-facts",
        )
        before = sum(small.evaluate(data, seed).scores) / len(data)
        after = sum(small.evaluate(data, found.best_candidate).scores) / len(data)
        print(f"FactsAdapter: accuracy before {before:.2f} after {after:.2f}")
        print(f"best_candidate: {found.best_candidate}; changed: {', '.join(found.changed)}")
        print(f"steps {found.result.steps}, accepted {found.result.accepted}; ledger in {found.run_dir}")
        optimizer.close()


if __name__ == "__main__":
    main()
