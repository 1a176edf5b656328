"""The periodic job of learning from production, in one call (and `opto production`):
read the traces and their feedback, start from the prompt production serves, train with
the logged rollouts as the first evidence, check the result on the newest traces, and
publish it to MLflow's prompt registry only when the check passed.

`production_cycle` returns a `Cycle` saying what it read, what the check found and what it
published or why not; `improved` is False when it could not improve with evidence (the
command then exits non-zero, for a scheduler to notice).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from pydantic import BaseModel

from ..core.agent import Agent
from ..core.feedback_guide import FeedbackGuide
from ..core.guides import ExactMatchGuide, Guide
from ..core.logged import split_newest
from ..core.parameters import Parameter
from ..datasets.traces import TraceRecords, read_otlp_json
from ..errors import OptoTypeError, OptoValueError
from ..llm.base import Model
from ..search.final_check import FinalCheck
from ..search.proposers import Optimizer
from ..trainer.aggregated import AggregatedUpdate

__all__ = ["Cycle", "load_agent", "production_cycle"]


class Cycle(BaseModel):
    """What one cycle did."""

    read: str
    logged: int
    checked_on: int
    check: str
    published: str
    improved: bool

    def summary(self) -> str:
        return "\n".join(
            [
                f"read: {self.read}",
                f"trained on {self.logged} logged traces; checked on the newest {self.checked_on}",
                self.check,
                self.published,
            ]
        )


def load_agent(spec: str) -> Agent:
    """The agent `module:factory` makes (a function of no argument returning an `Agent`).
    It is the user's own code, imported as the command line names it."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise OptoValueError(f"--agent takes MODULE:FACTORY (e.g. my_app.agent:make_agent), got {spec!r}")
    factory = getattr(importlib.import_module(module_name), attribute, None)
    if not callable(factory):
        raise OptoValueError(f"{spec}: {module_name} has no function {attribute}")
    agent = factory()
    if not isinstance(agent, Agent):
        raise OptoTypeError(f"{spec} must return an opto Agent, got {type(agent).__name__}")
    return agent


def production_cycle(
    agent: Agent,
    model: Model,
    *,
    prompt: str,
    parameter: str = "prompt",
    experiment: str | None = None,
    otlp: str | Path | None = None,
    expected: str | None = None,
    newest: float = 0.25,
    judge: Model | None = None,
    publish_result: bool = True,
    run_dir: str | Path | None = None,
    message: str | None = None,
) -> Cycle:
    """Read, train, check and publish (see the module's doc).

    Args:
        agent: the production agent; its parameter `parameter` is bound to `prompt`.
        model: the optimizer's model.
        prompt: `prompts:/NAME@ALIAS` in MLflow's prompt registry.
        parameter: the agent's parameter that holds the prompt.
        experiment: the MLflow experiment to read traces from (or `otlp`).
        otlp: an OTLP JSON export to read traces from (or `experiment`).
        expected: where the expected answer is: an MLflow expectation's name, or an OTLP
            span attribute (default for MLflow: the only expectation).
        newest: the share of the newest traces the check runs on (the search never does).
        judge: a judge model for traces without an expected answer (`FeedbackGuide`);
            without one, only traces with an expected answer are used.
        publish_result: False: check, but register nothing (a dry run).
        run_dir: the run's directory (ledger, checkpoint).
        message: the commit message of a published version.
    """
    from .mlflow import publish, registry_prompt

    if (experiment is None) == (otlp is None):
        raise OptoValueError("read traces from one place: an MLflow experiment or an OTLP JSON file")
    found: TraceRecords = (
        read_otlp_json(otlp, expected=expected) if otlp is not None else _mlflow_traces(experiment, expected)
    )
    records = found.records if judge is not None else [r for r in found.records if r.info is not None]
    if len(records) < 4:
        raise OptoValueError(
            f"{found.summary()}; {len(records)} usable (with an expected answer, or any with --judge-model): "
            "at least 4 are needed to train and check"
        )
    older, held = split_newest(records, newest)
    bound = registry_prompt(prompt, name=parameter)
    _bind(agent, parameter, bound)
    guide: Guide = ExactMatchGuide()
    if judge is not None:
        guide = FeedbackGuide(judge, records)
        guide.check_agreement()  # a judge that disagrees with the users is refused before any training
    trainer = AggregatedUpdate(agent, Optimizer(model), final_check=FinalCheck(examples=held))
    train = [(r.x, r.info) for r in older]
    result = trainer.train(guide, train, batch_size=min(4, len(older)), logged=older, run_dir=run_dir,
                           resume=run_dir is not None, progress=False)  # fmt: skip
    check = result.final_check.summary() if result.final_check is not None else "no final check"
    passed = result.final_check is not None and result.final_check.returned == "final"
    if not publish_result:
        said = "a dry run: nothing registered" + ("" if passed else " (and the check did not pass)")
        return Cycle(read=found.summary(), logged=len(older), checked_on=len(held), check=check, published=said,
                     improved=passed)  # fmt: skip
    published = publish(result, bound, message=message)
    return Cycle(read=found.summary(), logged=len(older), checked_on=len(held), check=check,
                 published=published.reason, improved=published.promoted)  # fmt: skip


def _mlflow_traces(experiment: str | None, expected: str | None) -> TraceRecords:
    from .mlflow import read_traces

    return read_traces(experiment, expected=expected)


def _bind(agent: Agent, name: str, bound: Parameter) -> None:
    """Put `bound` where the agent holds its parameter `name`."""
    names = [str(p.name) for p in agent.parameters()]  # names every parameter
    for attribute, value in vars(agent).items():
        if isinstance(value, Parameter) and value.name == name:
            setattr(agent, attribute, bound)
            return
    raise OptoValueError(f"the agent has no parameter {name!r} held as an attribute (it has {', '.join(names)})")
