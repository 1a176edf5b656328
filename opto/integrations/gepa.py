"""`gepa.optimize`'s own call, under opto's search: `optimize(seed_candidate, trainset, valset, adapter, ...)`.

A GEPA adapter (`gepa.core.adapter.GEPAAdapter`) runs a candidate, a dict of component
texts, on a batch (`evaluate(batch, candidate, capture_traces)`: outputs, scores and
trajectories) and says what a reflection should see (`make_reflective_dataset(candidate,
eval_batch, components_to_update)`). Here each component is a text `Parameter` of an
`AdapterAgent`, and a rollout is one data instance; the rollouts that run at once under
the same values are evaluated in one `evaluate` call, as GEPA calls it. The score is the
adapter's. The reflective records are asked for only when a step proposes, for the
components it updates and the rollouts its prompt shows (`AdapterReflection`); an
adapter's own `propose_new_texts` writes the new texts when it has one. Everything else
is opto's: validation, the final check, the ledger, resume, budgets and stop conditions.

`optimize` takes `gepa.optimize`'s arguments in its order and by its names, and maps each
to opto's equivalent (`GEPA_ORDER`, `NO_EQUIVALENT`); one with none is refused in one error
that says why. The result has GEPA's fields (`best_candidate`, `candidates`,
`val_aggregate_scores`, `best_idx`, `total_metric_calls`, ...) beside opto's `TrainResult`.

`gepa` itself is imported only for what needs it (its `DefaultAdapter` when `task_lm` is
given): `pip install "opto-agents[gepa]"`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import threading
import types
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..core.agent import Agent
from ..core.data import Example
from ..core.guides import Feedback, Guide
from ..core.parameters import Parameter
from ..core.rollout import Rollout, readable_json
from ..errors import OptoTypeError, OptoValueError
from ..llm.base import Model
from ..llm.errors import describe_error
from ..llm.instrument import count_and_record
from ..llm.litellm_model import LiteLLMModel
from ..llm.prices import known_price
from ..llm.types import Completion, Message, TokenUsage
from ..llm.usage import estimated_usage
from ..run.callbacks import Callback
from ..run.events import StepRecord
from ..run.results import TrainResult
from ..search.proposers import Optimizer, Proposal, _editable
from ..search.selection import EpsilonGreedy, TopK
from ..search.stopping import MaxCost
from ..trainer.aggregated import AggregatedUpdate
from ._options import TRACKING, apply_gepa_search, refuse_unmapped, split_options

__all__ = ["AdapterAgent", "AdapterGuide", "AdapterOutcome", "AdapterReflection", "GEPAResult", "optimize"]

logger = logging.getLogger(__name__)

#: `gepa.optimize`'s parameters in its order (gepa 0.1.4): positional arguments map by it.
GEPA_ORDER = (
    "seed_candidate", "trainset", "valset", "adapter", "task_lm", "evaluator", "reflection_lm",
    "reflection_lm_kwargs", "candidate_selection_strategy", "frontier_type", "skip_perfect_score",
    "batch_sampler", "reflection_minibatch_size", "perfect_score", "reflection_prompt_template",
    "custom_candidate_proposer", "module_selector", "use_merge", "max_merge_invocations",
    "merge_val_overlap_floor", "max_metric_calls", "max_reflection_cost", "stop_callbacks", "logger",
    "run_dir", "callbacks", "use_wandb", "wandb_api_key", "wandb_init_kwargs", "wandb_attach_existing",
    "use_mlflow", "mlflow_tracking_uri", "mlflow_experiment_name", "mlflow_attach_existing",
    "tracking_key_prefix", "track_best_outputs", "display_progress_bar", "use_cloudpickle",
    "cache_evaluation", "seed", "raise_on_exception", "val_evaluation_policy", "acceptance_criterion",
    "sampling_strategy", "selection_strategy", "reflection_strategy",
)  # fmt: skip

#: GEPA's arguments that are also `train()`'s, with the same meaning.
SHARED = ("seed", "run_dir", "callbacks")

#: GEPA's arguments opto has no equivalent for: the values accepted (GEPA's default), and why.
NO_EQUIVALENT: dict[str, tuple[tuple[Any, ...], str]] = {
    "frontier_type": (("instance",), "opto's pool keeps a front per example (GEPA's 'instance'), no other kind"),
    "batch_sampler": (("epoch_shuffled",), "opto's loader shuffles each epoch; set the batch with reflection_minibatch_size="),
    "reflection_prompt_template": ((None,), "opto's reflective prompt asks for a JSON reply; give the adapter a "
                                         "propose_new_texts, or pass custom_candidate_proposer="),
    "max_merge_invocations": ((5,), "opto merges every few steps of a pool run (use_merge=True), with no cap on merges"),
    "merge_val_overlap_floor": ((5,), "opto's merge needs no overlap floor: a merge is validated like any candidate"),
    "stop_callbacks": ((None,), "GEPA's stoppers read GEPA's state; pass opto's stop conditions as stop= "
                             "(MaxMetricCalls, MaxTime, NoImprovement, TargetScore, StopFile)"),
    "logger": ((None,), "opto logs through Python's logging (the 'opto' logger) and writes a ledger to run_dir"),
    "use_wandb": ((False,), TRACKING),
    "wandb_api_key": ((None,), TRACKING),
    "wandb_init_kwargs": ((None,), TRACKING),
    "wandb_attach_existing": ((False,), TRACKING),
    "use_mlflow": ((False,), TRACKING),
    "mlflow_tracking_uri": ((None,), TRACKING),
    "mlflow_experiment_name": ((None,), TRACKING),
    "mlflow_attach_existing": ((False,), TRACKING),
    "tracking_key_prefix": (("",), TRACKING),
    "use_cloudpickle": ((False,), "opto never pickles: its checkpoints are JSON"),
    "cache_evaluation": ((False,), "opto runs each measurement a decision needs; it has no evaluation cache"),
    "val_evaluation_policy": ((None, "full_eval"), "opto validates with its own rule: pass validation= (an opto Validation)"),
    "acceptance_criterion": (("strict_improvement",), "opto accepts by its validation rule (a paired test; "
                                                   "MinibatchFirst(accept_ties=True) accepts ties): pass validation="),
    "sampling_strategy": ((None,), "opto proposes with its own proposers: pass proposals= / proposers"),
    "selection_strategy": ((None,), "opto's candidate selection is selection= (greedy, pareto, top_k, epsilon_greedy)"),
    "reflection_strategy": ((None,), "opto's reflection is its Optimizer: pass reflection_lm= (a model)"),
}  # fmt: skip

#: GEPA's candidate selection strategies, as opto's `selection=`.
SELECTIONS: dict[str, Callable[[], Any]] = {
    "pareto": lambda: "pareto",
    "current_best": lambda: "greedy",
    "epsilon_greedy": lambda: EpsilonGreedy(0.1),
    "top_k_pareto": lambda: TopK(5),
}


class AdapterOutcome(BaseModel):
    """One data instance under one candidate: the adapter's output (as JSON) and score.
    `ref` names the agent's record of its trajectory, which the reflection reads."""

    model_config = ConfigDict(frozen=True)

    output: Any = None
    score: float | None = None
    feedback: str = ""
    ref: str = ""


@dataclasses.dataclass
class _Evaluated:
    """What `evaluate` gave for one instance (kept in memory, never written)."""

    output: Any
    score: float
    trajectory: Any
    batch: Any  # the `EvaluationBatch` it came in (its class makes the reflection's batch)


class _Waiting:
    """Instances waiting to be evaluated together under one candidate."""

    def __init__(self, candidate: dict[str, str]) -> None:
        self.candidate = candidate
        self.indices: list[int] = []
        self.futures: list[asyncio.Future[AdapterOutcome]] = []


class AdapterAgent(Agent):
    """A GEPA adapter as an opto agent: one text `Parameter` per component of the
    candidate (named as the component), and `forward(x)` evaluates the data instance `x`
    refers to (`{"instance": index, "input": a JSON view}`) under the current values.

    Rollouts that run at once under the same values are evaluated in one `evaluate` call
    (a batch, as GEPA calls it), with `capture_traces=True`; their trajectories stay in
    memory (the last `keep`) for `reflective_dataset`.

    Args:
        adapter: the `GEPAAdapter` (anything with `evaluate` and `make_reflective_dataset`).
        seed_candidate: {component name: starting text}.
        instances: the data instances, by index (`optimize` builds them from the datasets).
        descriptions: {component name: what it is}, shown to the optimizer.
        parallel: let batches of different candidates be evaluated at once (threads); by
            default one `evaluate` call runs at a time, as GEPA calls an adapter, since
            adapters need not be thread-safe.
        keep: trajectories kept for the reflection (the oldest go first).
    """

    def __init__(
        self,
        adapter: Any,
        seed_candidate: Mapping[str, str],
        instances: Sequence[Any],
        *,
        descriptions: Mapping[str, str] | None = None,
        parallel: bool = False,
        keep: int = 4096,
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
        self._waiting: dict[str, _Waiting] = {}
        self._dispatches: set[asyncio.Task[None]] = set()
        self._seen: collections.OrderedDict[str, _Evaluated] = collections.OrderedDict()
        self._seen_lock = threading.Lock()
        self._keep = keep

    def candidate(self) -> dict[str, str]:
        """The current values as a GEPA candidate."""
        return {name: str(p.value) for name, p in self.components.items()}

    async def forward(self, x: Mapping[str, Any]) -> AdapterOutcome:
        candidate = self.candidate()
        key = json.dumps(candidate, sort_keys=True)
        waiting = self._waiting.get(key)
        if waiting is None:
            waiting = self._waiting[key] = _Waiting(candidate)
            task = asyncio.get_running_loop().create_task(self._dispatch(key))
            self._dispatches.add(task)
            task.add_done_callback(self._dispatches.discard)
        future: asyncio.Future[AdapterOutcome] = asyncio.get_running_loop().create_future()
        waiting.indices.append(int(x["instance"]))
        waiting.futures.append(future)
        return await future

    async def _dispatch(self, key: str) -> None:
        """Evaluate, in one call, the instances that arrived while the rollouts started."""
        for _ in range(4):  # every rollout started with this one reaches forward() first
            await asyncio.sleep(0)
        waiting = self._waiting.pop(key)
        try:
            outcomes = await asyncio.to_thread(self.evaluate_batch, waiting.candidate, waiting.indices)
        except BaseException as exc:  # every rollout of the batch fails with it
            for future in waiting.futures:
                if not future.done():
                    future.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        for future, outcome in zip(waiting.futures, outcomes):
            if not future.done():  # a rollout that timed out no longer waits
                future.set_result(outcome)

    def evaluate_batch(self, candidate: dict[str, str], indices: Sequence[int]) -> list[AdapterOutcome]:
        """`evaluate` on the instances `indices` under `candidate`, one outcome each."""
        instances = [self.instances[i] for i in indices]
        with self._one_at_a_time:
            batch = self.adapter.evaluate(instances, candidate, True)
        outputs, scores = list(batch.outputs), list(batch.scores)
        if len(outputs) != len(instances) or len(scores) != len(instances):
            raise OptoValueError(
                f"the adapter's evaluate() returned {len(outputs)} outputs and {len(scores)} scores "
                f"for {len(instances)} instances"
            )
        trajectories = list(batch.trajectories) if batch.trajectories is not None else [None] * len(instances)
        outcomes = []
        with self._seen_lock:
            for output, score, trajectory in zip(outputs, scores, trajectories):
                ref = uuid.uuid4().hex
                self._seen[ref] = _Evaluated(output, float(score), trajectory, batch)
                outcomes.append(AdapterOutcome(output=_view(output), score=float(score), ref=ref))
            while len(self._seen) > self._keep:
                self._seen.popitem(last=False)
        return outcomes

    def reflective_dataset(
        self, candidate: dict[str, str], outcomes: Sequence[AdapterOutcome], components: list[str]
    ) -> Mapping[str, Sequence[Mapping[str, Any]]]:
        """`make_reflective_dataset` on the batch these outcomes came from, for `components`."""
        with self._seen_lock:
            found = [self._seen[o.ref] for o in outcomes if o.ref in self._seen]
        if not found:
            return {}
        batch = _batch_like(found)
        return self.adapter.make_reflective_dataset(candidate, batch, components)


def _batch_like(found: list[_Evaluated]) -> Any:
    """An evaluation batch of these instances, of the class the adapter returned."""
    fields = {
        "outputs": [e.output for e in found],
        "scores": [e.score for e in found],
        "trajectories": [e.trajectory for e in found],
    }
    kind = found[0].batch
    if dataclasses.is_dataclass(kind) and not isinstance(kind, type):
        names = {f.name for f in dataclasses.fields(kind)}
        return dataclasses.replace(kind, **{k: v for k, v in fields.items() if k in names}, **(
            {"objective_scores": None} if "objective_scores" in names else {}))  # fmt: skip
    return types.SimpleNamespace(**fields, objective_scores=None)


class AdapterGuide(Guide):
    """The adapter's own score as opto feedback (its reflective records are read only when
    a step proposes: `AdapterReflection`)."""

    def get_feedback(self, x: Any, output: Any, info: Any) -> Feedback:
        if not isinstance(output, AdapterOutcome):
            raise OptoTypeError(f"AdapterGuide judges an AdapterAgent's outcomes, got {type(output).__name__}")
        return Feedback(score=output.score, feedback=output.feedback)


ProposeFn = Callable[[dict[str, str], Mapping[str, Sequence[Mapping[str, Any]]], list[str]], dict[str, str]]


class AdapterReflection(Optimizer):
    """opto's reflective `Optimizer`, shown the adapter's reflective records.

    When a step proposes, `make_reflective_dataset` runs once, for the components the
    step updates and the rollouts the prompt shows (failures first); its records become
    the feedback the prompt shows. With `propose` (an adapter's `propose_new_texts`, or
    GEPA's `custom_candidate_proposer`), that function writes the new texts instead of
    the model. An exception of either is logged and the step makes no proposal, as GEPA
    skips such an iteration.

    Args:
        model: the reflection model.
        agent: the `AdapterAgent` whose rollouts it reflects on.
        propose: `propose(candidate, reflective_dataset, components_to_update) -> {name: text}`.
        settings: `Optimizer`'s keywords (`perfect_score`, `max_examples`, ...).
    """

    def __init__(
        self, model: Model | None, agent: AdapterAgent, *, propose: ProposeFn | None = None, **settings: Any
    ) -> None:
        if model is None and propose is None:
            raise OptoValueError(
                "a reflection needs a model: pass reflection_lm= (a LiteLLM name, a callable or an opto Model), "
                "or an adapter with propose_new_texts"
            )
        super().__init__(model if model is not None else _NoModel(), **settings)
        self.agent = agent
        self.propose_texts = propose

    async def propose(self, parameters: Sequence[Parameter], instance: Rollout) -> list[Proposal]:
        return await self.propose_batch(parameters, [instance])

    async def propose_batch(self, parameters: Sequence[Parameter], rollouts: Sequence[Rollout]) -> list[Proposal]:
        editable = [p for p in parameters if _editable(p) and p.name in self.agent.components]
        if not editable or all(self.went_right(r) for r in rollouts):
            return []
        failures = [r for r in rollouts if not self.went_right(r)][: self.max_examples]
        shown = [*failures, *[r for r in rollouts if self.went_right(r)][: self.successes]]
        names = [str(p.name) for p in editable]
        candidate = {p.name: str(p.value) for p in parameters if p.name in self.agent.components}
        outcomes = [r.output for r in shown if isinstance(r.output, AdapterOutcome)]
        seen = [r.example_id for r in shown]
        try:
            records = await asyncio.to_thread(self.agent.reflective_dataset, candidate, outcomes, names)
            if self.propose_texts is not None:
                texts = await asyncio.to_thread(self.propose_texts, candidate, records, names)
                return [_proposal(texts, candidate, names, seen)]
        except Exception as exc:  # GEPA logs a failed reflection and goes on
            logger.warning("the adapter's reflection failed, no proposal this step: %s", describe_error(exc))
            return []
        return await super().propose_batch(parameters, _with_records(shown, records))


def _proposal(texts: Any, candidate: dict[str, str], names: list[str], seen: list[str]) -> Proposal:
    if not isinstance(texts, Mapping):
        raise OptoTypeError(f"propose_new_texts must return {{component: text}}, got {type(texts).__name__}")
    update = {n: str(t) for n, t in texts.items() if n in names and str(t) != candidate.get(n)}
    return Proposal(
        update=update,
        reasoning="the adapter's propose_new_texts",
        proposer="adapter",
        instance_id=seen[0] if seen else "",
        instance_ids=seen,
        extraction_method="adapter",
        terminate=not update,
    )


def _with_records(shown: list[Rollout], records: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[Rollout]:
    """The rollouts with the records as their feedback: one record per rollout when every
    component has one each, else all of them on the first rollout."""
    records = {name: list(rows) for name, rows in (records or {}).items()}
    if records and all(len(rows) == len(shown) for rows in records.values()):
        return [
            r.model_copy(update={"feedback": _render({n: [rows[i]] for n, rows in records.items()})})
            for i, r in enumerate(shown)
        ]
    whole = "The adapter's reflective records for the examples shown:\n" + _render(records) if records else ""
    return [r.model_copy(update={"feedback": whole if i == 0 else ""}) for i, r in enumerate(shown)]


class _NoModel(Model):
    """The model of a reflection whose texts an adapter writes (never called)."""

    def __init__(self) -> None:
        super().__init__("adapter")

    async def _generate(self, messages: list[Message], **kwargs: Any) -> Completion:
        raise OptoValueError("this reflection's texts come from propose_new_texts; it calls no model")


class CallableModel(Model):
    """A GEPA reflection LM given as a function `lm(prompt: str) -> str`, as an opto `Model`
    (its prompt the messages' texts; its usage estimated from the text)."""

    def __init__(self, fn: Callable[[str], str], name: str | None = None) -> None:
        super().__init__(name or str(getattr(fn, "__name__", "reflection_lm")))
        self.fn = fn

    async def _generate(self, messages: list[Message], **kwargs: Any) -> Completion:
        prompt = "\n\n".join(str(m.get("content") or "") for m in messages)
        texts = []
        for _ in range(kwargs.get("n") or 1):
            reply = await asyncio.to_thread(self.fn, prompt)
            if not isinstance(reply, str):
                raise OptoTypeError(f"reflection_lm must return a str, got {type(reply).__name__}")
            texts.append(reply)
        return Completion(texts=texts, usage=estimated_usage(messages, texts), model=self.name)


def reflection_model(reflection_lm: Any, settings: Mapping[str, Any] | None = None) -> Model:
    """GEPA's `reflection_lm` as an opto `Model`: a LiteLLM model name (with
    `reflection_lm_kwargs`), a callable `lm(prompt) -> str`, or an opto `Model`."""
    if isinstance(reflection_lm, Model):
        return reflection_lm
    if isinstance(reflection_lm, str):
        return LiteLLMModel(reflection_lm, **dict(settings or {}))
    if callable(reflection_lm):
        return CallableModel(reflection_lm)
    raise OptoTypeError(
        f"reflection_lm must be a LiteLLM model name, a callable lm(prompt) -> str or an opto Model, "
        f"got {type(reflection_lm).__name__}"
    )


class _CountedLM:
    """A GEPA `LM` an adapter holds, its calls counted in opto's usage (and traced)."""

    def __init__(self, lm: Any) -> None:
        self.lm = lm

    def __getattr__(self, name: str) -> Any:
        return getattr(self.lm, name)

    def __call__(self, prompt: Any) -> str:
        return self.batch_complete([prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]])[0]

    def batch_complete(self, messages_list: list[list[dict[str, Any]]], *args: Any, **kwargs: Any) -> list[str]:
        before = (self.lm.total_tokens_in, self.lm.total_tokens_out)
        if len(messages_list) == 1 and not args and not kwargs and not hasattr(self.lm, "batch_complete"):
            texts = [self.lm(messages_list[0])]
        else:
            texts = self.lm.batch_complete(messages_list, *args, **kwargs)
        spent_in = self.lm.total_tokens_in - before[0]
        spent_out = self.lm.total_tokens_out - before[1]
        share = max(1, len(messages_list))
        model = str(getattr(self.lm, "model", "task_lm"))
        for messages, text in zip(messages_list, texts):
            usage = (
                TokenUsage(prompt_tokens=spent_in // share, completion_tokens=spent_out // share)
                if spent_in or spent_out
                else estimated_usage(messages, [text])
            )
            count_and_record(model, messages, Completion(texts=[text], usage=usage, model=model), known_price(model))
        return list(texts)


@contextlib.contextmanager
def _counting_task_calls(adapter: Any) -> Any:
    """While the run lasts, the GEPA `LM`s the adapter holds (GEPA's `DefaultAdapter`
    given a model name keeps one) count their calls in opto's usage."""
    swapped = {}
    for name, value in list(vars(adapter).items()) if hasattr(adapter, "__dict__") else []:
        if type(value).__name__ in ("LM", "TrackingLM") and type(value).__module__.startswith("gepa"):
            swapped[name] = value
            setattr(adapter, name, _CountedLM(value))
    try:
        yield
    finally:
        for name, value in swapped.items():
            setattr(adapter, name, value)


class _Candidates(Callback):
    """GEPA's view of a run: every accepted candidate, its parent and its validation score."""

    def __init__(self, seed: dict[str, str]) -> None:
        self.candidates: list[dict[str, str]] = [dict(seed)]
        self.parents: list[list[int | None]] = [[None]]
        self.scores: list[float | None] = [None]
        self.discovered_at: list[int] = [0]

    def on_step_end(self, record: StepRecord) -> None:
        decision = next((d for d in record.decisions if d.current_score is not None), None)
        if decision is not None and self.scores[0] is None and record.start_values == self.candidates[0]:
            self.scores[0] = decision.current_score
        if not record.accepted:
            return
        start = {k: str(v) for k, v in record.start_values.items() if k in self.candidates[0]}
        found = {**start, **{k: str(v) for k, v in record.update.items() if k in self.candidates[0]}}
        self.parents.append([self.candidates.index(start) if start in self.candidates else None])
        self.candidates.append(found)
        self.scores.append(record.candidate_score)
        self.discovered_at.append(record.step)


class GEPAResult(BaseModel):
    """`optimize`'s result: GEPA's fields beside opto's `TrainResult`.

    `best_candidate` is what opto returns (after its final check); `candidates` are the
    seed and every accepted candidate in order, `parents` their parents' indices,
    `val_aggregate_scores` the validation score each was accepted with (the seed's as
    first measured), `best_idx` the index of `best_candidate` among them, and
    `total_metric_calls` the rollouts the run made (GEPA's metric calls).
    """

    best_candidate: dict[str, str]
    seed_candidate: dict[str, str]
    result: TrainResult
    candidates: list[dict[str, str]] = Field(default_factory=list)
    parents: list[list[int | None]] = Field(default_factory=list)
    val_aggregate_scores: list[float | None] = Field(default_factory=list)
    discovery_eval_counts: list[int] = Field(default_factory=list)
    best_idx: int = 0
    total_metric_calls: int = 0
    seed: int = 0
    run_dir: str | None = None
    changed: list[str] = Field(default_factory=list)
    proposer: str = "opto"

    @property
    def num_candidates(self) -> int:
        return len(self.candidates)


def optimize(
    seed_candidate: Mapping[str, str],
    trainset: Any,
    valset: Any = None,
    adapter: Any = None,
    task_lm: Any = None,
    evaluator: Any = None,
    reflection_lm: Any = None,
    *more: Any,
    model: Model | None = None,
    descriptions: Mapping[str, str] | None = None,
    parallel: bool = False,
    proposer: str = "auto",
    **options: Any,
) -> GEPAResult:
    """Optimize the components of `seed_candidate` for `adapter` with opto's search, called
    as `gepa.optimize` is.

    Args:
        seed_candidate: {component name: starting text}.
        trainset: the data instances the steps learn from (a list or a GEPA `DataLoader`).
        valset: instances candidates are validated on (opto's `validation=`); None: opto's
            default (a split held out from `trainset` when it is large enough).
        adapter: a `GEPAAdapter` (GEPA's own, e.g. for DSPy programs or RAG, or yours).
        task_lm: without an adapter, GEPA's `DefaultAdapter` runs this model (a LiteLLM
            name or a callable `lm(messages) -> str`), judged by `evaluator`.
        evaluator: the `DefaultAdapter`'s evaluator (GEPA's default: the answer is contained).
        reflection_lm: the model that proposes new texts: a LiteLLM name (with
            `reflection_lm_kwargs`), a callable `lm(prompt) -> str`, or an opto `Model`.
        more: `gepa.optimize`'s further arguments, in its order.
        model: opto's name for `reflection_lm` (give one of the two).
        descriptions: {component name: what it is}, for the optimizer's prompt.
        parallel: let different candidates' batches be evaluated at once (the adapter must
            be thread-safe).
        proposer: who writes new texts: "auto" (the adapter's `propose_new_texts` or
            `custom_candidate_proposer` when there is one, else opto's reflection), "adapter",
            or "opto" (opto's reflection even when the adapter has its own).
        options: `gepa.optimize`'s keywords (each mapped to opto's equivalent, or refused
            with why: the table of the docs' "From DSPy and GEPA"), `component_selector=` (DSPy's name
            for `module_selector`), `AggregatedUpdate`'s keywords and `train()`'s.

    Returns:
        A `GEPAResult`: GEPA's fields (`best_candidate`, `candidates`, `best_idx`,
        `val_aggregate_scores`, `total_metric_calls`) and opto's `TrainResult`.
    """
    if len(more) > len(GEPA_ORDER) - 7:
        raise OptoTypeError(f"optimize() takes at most {len(GEPA_ORDER)} positional arguments, as gepa.optimize does")
    named = dict(zip(GEPA_ORDER[7:], more))
    for name in named:
        if name in options:
            raise OptoTypeError(f"optimize() got multiple values for argument {name!r}")
    options = {**named, **options}
    if "component_selector" in options:
        if "module_selector" in options:
            raise OptoValueError("give module_selector= or component_selector= (its DSPy name), not both")
        options["module_selector"] = options.pop("component_selector")
    gepa_options = {k: options.pop(k) for k in GEPA_ORDER if k in options and k not in SHARED}
    refuse_unmapped(gepa_options, NO_EQUIVALENT, "optimize()")
    if options.get("callbacks") and not all(isinstance(c, Callback) for c in options["callbacks"]):
        raise OptoValueError(
            "callbacks= takes opto Callbacks (GEPA's GEPACallback has no equivalent: opto.Callback sees every "
            "ledger event and step)"
        )
    trainer_options, train_options = split_options(options, "optimize()")
    if reflection_lm is not None and model is not None:
        raise OptoValueError("give reflection_lm= or model= (opto's name for it), not both")
    adapter = _adapter(adapter, task_lm, evaluator)
    train_items = _items(trainset, "trainset")
    val_items = _items(valset, "valset") if valset is not None else []
    instances = [*train_items, *val_items]
    train = [Example({"instance": i, "input": _view(inst)}, id=f"train-{i}") for i, inst in enumerate(train_items)]
    start = len(train_items)
    validation = [
        Example({"instance": start + i, "input": _view(inst)}, id=f"val-{i}") for i, inst in enumerate(val_items)
    ]
    if validation and "validation" not in trainer_options:
        trainer_options["validation"] = validation
    agent = AdapterAgent(adapter, seed_candidate, instances, descriptions=descriptions, parallel=parallel)
    _apply_gepa_options(gepa_options, trainer_options, train_options, len(train))
    propose = _propose_fn(adapter, gepa_options.get("custom_candidate_proposer"), proposer)
    lm = reflection_lm if reflection_lm is not None else model
    reflection = AdapterReflection(
        reflection_model(lm, gepa_options.get("reflection_lm_kwargs")) if lm is not None else None,
        agent,
        propose=propose,
        # GEPA reflects on a batch unless all of it is perfect; skip_perfect_score=False: always.
        perfect_score=float(gepa_options.get("perfect_score", 1.0))
        if gepa_options.get("skip_perfect_score", True)
        else float("inf"),
    )
    history = _Candidates(dict(seed_candidate))
    train_options["callbacks"] = [*(train_options.get("callbacks") or []), history]
    trainer = AggregatedUpdate(agent, reflection, **trainer_options)
    with _counting_task_calls(adapter):
        result = trainer.train(AdapterGuide(), train, **{"progress": False, **train_options})
    best = {name: str(result.final_parameters.get(name, text)) for name, text in seed_candidate.items()}
    if best not in history.candidates:
        history.candidates.append(best)
        history.parents.append([None])
        history.scores.append(None)
        history.discovered_at.append(result.steps)
    return GEPAResult(
        best_candidate=best,
        seed_candidate=dict(seed_candidate),
        result=result,
        candidates=history.candidates,
        parents=history.parents,
        val_aggregate_scores=history.scores,
        discovery_eval_counts=history.discovered_at,
        best_idx=history.candidates.index(best),
        total_metric_calls=result.metric_calls,
        seed=int(train_options.get("seed", 0)),
        run_dir=str(train_options["run_dir"]) if train_options.get("run_dir") is not None else None,
        changed=[name for name in best if best[name] != seed_candidate[name]],
        proposer="adapter" if propose is not None else "opto",
    )


def _apply_gepa_options(gepa: Mapping[str, Any], trainer: dict[str, Any], train: dict[str, Any], n_train: int) -> None:
    """GEPA's arguments as opto's options (the trainer's and `train()`'s)."""
    strategy = gepa.get("candidate_selection_strategy")
    if strategy is not None:
        if not isinstance(strategy, str) or strategy not in SELECTIONS:
            raise OptoValueError(
                f"candidate_selection_strategy must be one of {', '.join(map(repr, SELECTIONS))}, got {strategy!r} "
                "(an opto CandidateSelector goes in selection=)"
            )
        trainer.setdefault("selection", SELECTIONS[strategy]())
    calls = gepa.get("max_metric_calls")
    apply_gepa_search(trainer, train, n_train=n_train, components=gepa.get("module_selector"),
                      use_merge=bool(gepa.get("use_merge")), minibatch=gepa.get("reflection_minibatch_size"),
                      metric_calls=int(calls) if calls is not None else None)  # fmt: skip
    if gepa.get("max_reflection_cost") is not None:  # every model's spend: it stops no later than GEPA's
        cost = MaxCost(float(gepa["max_reflection_cost"]))
        train["stop"] = train["stop"] | cost if train.get("stop") is not None else cost
    if "display_progress_bar" in gepa:
        train.setdefault("progress", bool(gepa["display_progress_bar"]))
    if gepa.get("raise_on_exception") is False:
        train.setdefault("max_failures", None)  # go on whatever fails, as GEPA then does
    if train.get("run_dir") is not None:
        train.setdefault("resume", True)  # GEPA continues a run it finds in run_dir


def _adapter(adapter: Any, task_lm: Any, evaluator: Any) -> Any:
    """The adapter, or GEPA's `DefaultAdapter` on `task_lm` (as `gepa.optimize` makes it)."""
    if adapter is not None:
        if task_lm is not None or evaluator is not None:
            raise OptoValueError("with an adapter, task_lm and evaluator are the adapter's own: give neither")
        return adapter
    if task_lm is None:
        raise OptoValueError(
            "optimize() needs an adapter=, or a task_lm= (then GEPA's DefaultAdapter runs it, as gepa.optimize does)"
        )
    try:
        from gepa.adapters.default_adapter.default_adapter import DefaultAdapter
    except ImportError as exc:
        raise OptoValueError('task_lm= runs GEPA\'s DefaultAdapter: pip install "opto-agents[gepa]"') from exc
    if not isinstance(task_lm, str):
        task_lm = _counted_callable(task_lm)
    return DefaultAdapter(model=task_lm, evaluator=evaluator)


def _counted_callable(fn: Callable[[list[dict[str, Any]]], str]) -> Callable[[list[dict[str, Any]]], str]:
    """A task model given as a function, its calls counted in opto's usage (estimated tokens)."""
    name = getattr(fn, "__name__", "task_lm")

    def counted(messages: list[dict[str, Any]]) -> str:
        text = fn(messages)
        count_and_record(name, messages, Completion(texts=[str(text)], usage=estimated_usage(messages, [str(text)]),
                                                    model=name), None)  # fmt: skip
        return text

    return counted


def _propose_fn(adapter: Any, custom: Any, proposer: str) -> ProposeFn | None:
    """Who writes the texts: the adapter's own `propose_new_texts` or GEPA's
    `custom_candidate_proposer` (not both), unless `proposer="opto"` asks for opto's."""
    if proposer not in ("auto", "adapter", "opto"):
        raise OptoValueError(f'proposer must be "auto", "adapter" or "opto", got {proposer!r}')
    own = getattr(adapter, "propose_new_texts", None)
    if own is not None and custom is not None:
        raise OptoValueError("the adapter has propose_new_texts; custom_candidate_proposer= would replace it: give one")
    found = own if own is not None else custom
    if proposer == "opto":
        if custom is not None:
            raise OptoValueError('proposer="opto" and custom_candidate_proposer= ask for two proposers: give one')
        return None
    if found is None and proposer == "adapter":
        raise OptoValueError(
            'proposer="adapter", but the adapter has no propose_new_texts and no custom_candidate_proposer'
        )
    if found is not None and not callable(found):
        raise OptoTypeError(f"propose_new_texts must be callable, got {type(found).__name__}")
    return found


def _items(data: Any, what: str) -> list[Any]:
    """The instances of a list, or of a GEPA `DataLoader` (`all_ids()`, `fetch(ids)`)."""
    if callable(getattr(data, "all_ids", None)) and callable(getattr(data, "fetch", None)):
        return list(data.fetch(list(data.all_ids())))
    if isinstance(data, (str, bytes, Mapping)) or not isinstance(data, Sequence):
        raise OptoTypeError(
            f"{what} must be a list of data instances or a GEPA DataLoader (all_ids(), fetch(ids)), "
            f"got {type(data).__name__}"
        )
    if not data and what == "trainset":
        raise OptoValueError("trainset is empty: give at least one data instance")
    return list(data)


def _view(value: Any) -> Any:
    """`value` as JSON values for the ledger and the optimizer's prompt."""
    return readable_json(value)


def _render(records: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """Reflective records as text, once when every component has the same."""
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
