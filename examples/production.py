"""Learning from production with MLflow: traces and feedback in, a better prompt out,
published only when it holds on the newest traces, and rolled back in one call.

Production here is simulated, offline: MLflow runs in this process on a SQLite store
(`runs/production/mlflow.db`; MLflow's full package), a traced agent answers with the
prompt its registry serves as `@production`, and users leave thumbs, comments and,
sometimes, the right answer. Then the cycle a scheduled job runs (`opto production`
does the same from the command line):

1. read the traces and their feedback (`read_traces`);
2. hold out the newest, start from the prompt production serves (`registry_prompt`);
3. train with the logged rollouts as the first evidence (no agent call on them);
4. publish only when the final check on the newest passed, keeping the old version as
   `previous` (`publish`), and show the one-call way back (`rollback`).

    pip install "opto-agents[mlflow]" mlflow
    python examples/production.py           # offline, about 20 seconds
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

os.environ.setdefault("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")  # traces written before feedback is
import mlflow  # noqa: E402
from mlflow.entities import AssessmentSource  # noqa: E402

from opto import Agent, AggregatedUpdate, ExactMatchGuide, FinalCheck, Optimizer, Parameter, ScriptedModel  # noqa: E402
from opto.core.logged import split_newest  # noqa: E402
from opto.integrations.mlflow import publish, read_traces, registry_prompt, rollback  # noqa: E402

CAPITALS = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Peru": "Lima", "Japan": "Tokyo",
            "Kenya": "Nairobi", "Egypt": "Cairo", "Chile": "Santiago", "Ghana": "Accra", "Nepal": "Kathmandu",
            "Cuba": "Havana", "Fiji": "Suva"}  # fmt: skip


class Capitals(Agent):
    """Names the capital only when its prompt asks for the capital city."""

    def __init__(self, prompt: str) -> None:
        self.prompt = Parameter(prompt, description="the system prompt")

    def forward(self, question: str) -> str:
        country = question.rsplit(" ", 1)[-1].rstrip("?")
        return CAPITALS[country] if "capital city" in str(self.prompt.value) else "It is a lovely place."


def simulate_production(experiment: str) -> None:
    """Requests answered with the prompt production serves, each judged by its user."""
    mlflow.set_experiment(experiment)
    served = mlflow.genai.load_prompt("prompts:/capitals@production").template
    agent = Capitals(served)
    traced = mlflow.trace(agent.forward, name="capitals")
    user = AssessmentSource(source_type="HUMAN", source_id="app-users")
    for country in CAPITALS:
        traced(f"What is the capital of {country}?")
        trace_id = mlflow.get_last_active_trace_id()
        mlflow.log_feedback(trace_id=trace_id, name="thumbs", value=False, rationale="I asked for the city",
                            source=user)  # fmt: skip
        mlflow.log_expectation(trace_id=trace_id, name="expected_answer", value=CAPITALS[country])


def optimizer(messages: list[dict[str, str]]) -> str:
    """A stand-in for the optimizer's model: it reads the users' comments in its prompt."""
    asked = "asked for the city" in messages[-1]["content"]
    update = "Answer with the capital city, in one word." if asked else "Answer politely."
    return json.dumps({"reasoning": "the users asked for the city", "suggestion": {"prompt": update}})


def main() -> None:
    logging.getLogger("mlflow").setLevel(logging.ERROR)
    folder = Path("runs/production")
    folder.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(f"sqlite:///{folder.resolve() / 'mlflow.db'}")
    first = mlflow.genai.register_prompt(name="capitals", template="Answer the question.")
    mlflow.genai.set_prompt_alias("capitals", alias="production", version=int(first.version))
    experiment = f"production-{first.version}"
    simulate_production(experiment)

    # The cycle.
    found = read_traces(experiment)
    print(found.summary())
    older, newest = split_newest(found.records, 0.25)
    agent = Capitals("")
    agent.prompt = registry_prompt("prompts:/capitals@production", name="prompt")
    trainer = AggregatedUpdate(agent, Optimizer(ScriptedModel(optimizer)), final_check=FinalCheck(examples=newest))
    result = trainer.train(ExactMatchGuide(), [(r.x, r.info) for r in older], logged=older,
                           run_dir=folder / f"run-{first.version}", progress=False)  # fmt: skip
    print(result.final_check.summary() if result.final_check else "no final check")
    print(publish(result, agent.prompt, message="asks for the capital").reason)
    print("production serves:", mlflow.genai.load_prompt("prompts:/capitals@production", cache_ttl_seconds=0).template)
    print(rollback(agent.prompt).reason)


if __name__ == "__main__":
    main()
