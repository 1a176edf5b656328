"""Any GEPA adapter under opto's search: `optimize(adapter, seed_candidate, trainset, ...)`.

A GEPA adapter (`gepa.core.adapter.GEPAAdapter`) runs a candidate, a dict of component
texts, on a batch (`evaluate(batch, candidate, capture_traces)`, which gives outputs,
scores and trajectories) and says what a reflection should see
(`make_reflective_dataset(candidate, eval_batch, components_to_update)`). Here each
component is a text `Parameter` of an `AdapterAgent`; a rollout evaluates one data
instance; the score is the adapter's, and the feedback the optimizer is shown is that
instance's reflective records. Everything else is opto's: the proposers, the aggregator,
validation, the ledger, resume, budgets and stop conditions.

The adapter is duck-typed: `gepa` itself is not imported (`pip install "opto-agents[gepa]"`
for GEPA's own adapters).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..core.agent import Agent
from ..core.data import Example
from ..core.guides import Feedback, Guide
from ..core.parameters import Parameter
from ..errors import OptoTypeError, OptoValueError
from ..extraction.loose_json import json_safe
from ..llm.base import Model
from ..run.results import TrainResult
from ..search.proposers import Optimizer
from ..trainer.aggregated import AggregatedUpdate
from ._options import split_options

__all__ = ["AdapterAgent", "AdapterGuide", "AdapterOutcome", "GEPAResult", "optimize"]


class AdapterOutcome(BaseModel):
    """One data instance under one candidate: the adapter's output, score and the text of
    its reflective records (what the optimizer is shown as feedback)."""

    model_config = ConfigDict(frozen=True)

    output: Any = None
    score: float | None = None
    feedback: str = ""


class AdapterAgent(Agent):
    """A GEPA adapter as an opto agent: one text `Parameter` per component of the
    candidate (named as the component), and `forward(x)` evaluates the data instance `x`
    refers to (`{"instance": index, "input": a JSON view}`) under the current values.

    Args:
        adapter: the `GEPAAdapter` (anything with `evaluate` and `make_reflective_dataset`).
        seed_candidate: {component name: starting text}.
        instances: the data instances, by index (`optimize` builds them from the datasets).
        descriptions: {component name: what it is}, shown to the optimizer.
        parallel: evaluate several instances at once (threads); by default one at a time,
            as GEPA calls an adapter, since adapters need not be thread-safe.
    """

    def __init__(
        self,
        adapter: Any,
        seed_candidate: Mapping[str, str],
        instances: Sequence[Any],
        *,
        descriptions: Mapping[str, str] | None = None,
        parallel: bool = False,
    ) -> None:
        for method in ("evaluate", "make_reflective_dataset"):
            if not callable(getattr(adapter, method, None)):
                raise OptoTypeError(
                    f"adapter must be a GEPA adapter with evaluate() and make_reflective_dataset(); "
                    f"{type(adapter).__name__} has no {method}()"
                )
        if not seed_candidate or not all(isinstance(k, str) and isinstance(v, str) for k, v in seed_candidate.items()):
            raise OptoValueError(
                "seed_candidate must be a non-empty {component name: text} dict of strings, got " + repr(seed_candidate)
            )
        self.adapter = adapter
        self.instances = list(instances)
        described = dict(descriptions or {})
        self.components = {
            name: Parameter(text, name=name, description=described.get(name, f"the component {name!r} of the program"))
            for name, text in seed_candidate.items()
        }
        self._one_at_a_time: contextlib.AbstractContextManager[Any] = (
            contextlib.nullcontext() if parallel else threading.Lock()
        )

    def candidate(self) -> dict[str, str]:
        """The current values as a GEPA candidate."""
        return {name: str(p.value) for name, p in self.components.items()}

    async def forward(self, x: Mapping[str, Any]) -> AdapterOutcome:
        instance = self.instances[int(x["instance"])]
        return await asyncio.to_thread(self._evaluate, instance, self.candidate())

    def _evaluate(self, instance: Any, candidate: dict[str, str]) -> AdapterOutcome:
        with self._one_at_a_time:
            batch = self.adapter.evaluate([instance], candidate, True)
            outputs, scores = list(batch.outputs), list(batch.scores)
            if len(outputs) != 1 or len(scores) != 1:
                raise OptoValueError(
                    f"the adapter's evaluate() returned {len(outputs)} outputs and {len(scores)} scores for one instance"
                )
            records = self.adapter.make_reflective_dataset(candidate, batch, list(candidate))
        return AdapterOutcome(output=_view(outputs[0]), score=float(scores[0]), feedback=_render(records))


class AdapterGuide(Guide):
    """The adapter's own score and reflective records, as opto feedback."""

    def get_feedback(self, x: Any, output: Any, info: Any) -> Feedback:
        if not isinstance(output, AdapterOutcome):
            raise OptoTypeError(f"AdapterGuide judges an AdapterAgent's outcomes, got {type(output).__name__}")
        return Feedback(score=output.score, feedback=output.feedback)


class GEPAResult(BaseModel):
    """`optimize`'s result: GEPA's `best_candidate` beside opto's `TrainResult`."""

    best_candidate: dict[str, str]
    seed_candidate: dict[str, str]
    result: TrainResult
    run_dir: str | None = None
    changed: list[str] = Field(default_factory=list)


def optimize(
    adapter: Any,
    seed_candidate: Mapping[str, str],
    trainset: Sequence[Any],
    valset: Sequence[Any] | None = None,
    *,
    model: Model,
    descriptions: Mapping[str, str] | None = None,
    parallel: bool = False,
    **options: Any,
) -> GEPAResult:
    """Optimize the components of `seed_candidate` for `adapter` with opto's search.

    Args:
        adapter: a `GEPAAdapter` (GEPA's own, e.g. for DSPy programs or RAG, or yours).
        seed_candidate: {component name: starting text}.
        trainset: the data instances the steps learn from.
        valset: instances candidates are validated on (`validation=` of `AggregatedUpdate`);
            None: opto's default (a split held out from `trainset` when it is large enough).
        model: the opto `Model` that proposes new texts and merges proposals.
        descriptions: {component name: what it is}, for the optimizer's prompt.
        parallel: evaluate instances in threads at once (the adapter must be thread-safe).
        options: `AggregatedUpdate`'s keywords (`selection`, `proposals`, `validation`, ...)
            and `train()`'s (`batch_size`, `num_epochs`, `run_dir`, `resume`, `stop`,
            `budget`, `confirm`, ...).

    Returns:
        A `GEPAResult`: `best_candidate` (the values the run ended with) and opto's `TrainResult`.
    """
    trainer_options, train_options = split_options(options, "optimize()")
    instances = [*trainset, *(valset or [])]
    train = [Example({"instance": i, "input": _view(inst)}, id=f"train-{i}") for i, inst in enumerate(trainset)]
    start = len(trainset)
    validation = [
        Example({"instance": start + i, "input": _view(inst)}, id=f"val-{i}") for i, inst in enumerate(valset or [])
    ]
    if validation and "validation" not in trainer_options:
        trainer_options["validation"] = validation
    agent = AdapterAgent(adapter, seed_candidate, instances, descriptions=descriptions, parallel=parallel)
    trainer = AggregatedUpdate(agent, Optimizer(model), **trainer_options)
    result = trainer.train(AdapterGuide(), train, **{"progress": False, **train_options})
    best = {name: str(result.final_parameters.get(name, text)) for name, text in seed_candidate.items()}
    return GEPAResult(
        best_candidate=best,
        seed_candidate=dict(seed_candidate),
        result=result,
        run_dir=str(train_options["run_dir"]) if train_options.get("run_dir") is not None else None,
        changed=[name for name in best if best[name] != seed_candidate[name]],
    )


def _view(value: Any) -> Any:
    """`value` as JSON values for the ledger and the optimizer's prompt (its text when it
    has no JSON form)."""
    try:
        return json_safe(value)
    except (ValueError, TypeError):
        to_dict = getattr(value, "toDict", None)  # dspy.Example
        if callable(to_dict):
            try:
                return json_safe(to_dict())
            except (ValueError, TypeError):
                pass
        return str(value)


def _render(records: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """The reflective records of one instance as text, once when every component has the same."""
    rendered = {name: "\n".join(_record(r) for r in rows) for name, rows in (records or {}).items()}
    if len(set(rendered.values())) <= 1:
        return next(iter(rendered.values()), "")
    return "\n".join(f"[{name}]\n{text}" for name, text in rendered.items())


def _record(record: Mapping[str, Any]) -> str:
    if not isinstance(record, Mapping):
        return str(record)
    lines = []
    for key, value in record.items():
        text = value if isinstance(value, str) else json.dumps(_view(value), ensure_ascii=False)
        lines.append(f"{key}: {text}")
    return "\n".join(lines)
