"""opto's search as a DSPy teleprompter: `OptoOptimizer(metric).compile(program, trainset=...)`.

Each predictor's instructions (and, with `demos=True`, its demos) become opto
`Parameter`s; the program runs as the agent, each rollout on a copy carrying the values
under test; the metric becomes the guide, and a metric that returns a score with
feedback text (GEPA's `dspy.Prediction(score=..., feedback=...)`) gives that text to the
optimizer. Every LM call the program makes lands in the rollout's trace and the run's
usage: DSPy 3 may send calls through its native clients rather than LiteLLM, so they are
seen through DSPy's own callbacks (`on_lm_start`/`on_lm_end`), which see every backend.

`dspy` is an optional extra (`pip install "opto-agents[dspy]"`), imported with this module.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..core.agent import Agent
from ..core.data import Example
from ..core.guides import Feedback, Guide
from ..core.parameters import Demos, Parameter
from ..errors import MissingDependencyError, OptoTypeError, OptoValueError
from ..llm.base import Model
from ..llm.instrument import count_and_record
from ..llm.litellm_model import LiteLLMModel
from ..llm.prices import known_price
from ..llm.types import Completion, TokenUsage, validate_messages
from ..llm.usage import estimated_usage
from ..run.results import TrainResult
from ..search.proposers import DemoProposer, Optimizer
from ..trainer.aggregated import AggregatedUpdate
from ._options import split_options

try:
    import dspy
    from dspy.teleprompt import Teleprompter
    from dspy.utils.callback import BaseCallback
except ImportError as exc:  # pragma: no cover - the extra is installed where this module is used
    raise MissingDependencyError('opto.integrations.dspy needs DSPy 3: pip install "opto-agents[dspy]"') from exc

__all__ = ["OptoOptimizer", "ProgramAgent", "MetricGuide"]

#: The output key under which a rollout keeps each predictor's inputs and outputs (demos).
PREDICTORS = "_predictors"


class _LMCalls(BaseCallback):
    """Records each DSPy LM call in the current rollout's trace and the run's usage."""

    def __init__(self) -> None:
        self._started: dict[str, tuple[Any, list[dict[str, Any]]]] = {}
        self._lock = threading.Lock()

    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        messages = inputs.get("messages") or [{"role": "user", "content": str(inputs.get("prompt") or "")}]
        with self._lock:
            self._started[call_id] = (instance, list(messages))

    def on_lm_end(self, call_id: str, outputs: Any, exception: Exception | None) -> None:
        with self._lock:
            instance, messages = self._started.pop(call_id, (None, []))
        if exception is not None or instance is None:
            return
        texts = [_text(output) for output in (outputs or [""])]
        model = str(getattr(instance, "model", "dspy-lm"))
        completion = Completion(texts=texts, usage=_usage(instance, messages, texts), model=model)
        count_and_record(model, validate_messages(_plain(messages)), completion, known_price(model))


def _usage(lm: Any, messages: list[dict[str, Any]], texts: list[str]) -> TokenUsage:
    """The call's usage from the LM's history (the entry of these messages and outputs),
    else estimated from the text."""
    for entry in reversed(list(getattr(lm, "history", []) or [])[-16:]):
        if entry.get("messages") == messages and list(entry.get("outputs") or []) == texts:
            found = entry.get("usage") or {}
            if found.get("prompt_tokens") is not None:
                return TokenUsage(
                    prompt_tokens=int(found["prompt_tokens"]),
                    completion_tokens=int(found.get("completion_tokens") or 0),
                )
    return estimated_usage(messages, texts)


def _text(output: Any) -> str:
    """One LM output's text (DSPy gives a string, or a dict with "text" beside tool calls)."""
    if isinstance(output, dict):
        return str(output.get("text") or "")
    return str(output)


def _plain(messages: list[Any]) -> list[dict[str, Any]]:
    return [{"role": str(m.get("role", "user")), "content": m.get("content") or ""} for m in messages]


class ProgramAgent(Agent):
    """A DSPy program as an opto agent: `{predictor name}` is a text `Parameter` holding
    that predictor's instructions (and `{predictor name}.demos` a `Demos` with its demos).
    `forward(inputs)` runs a copy of the program carrying the current values, and returns
    the prediction's fields."""

    def __init__(self, program: Any, *, demos: bool = False, max_demos: int = 4) -> None:
        if not isinstance(program, dspy.Module):
            raise OptoTypeError(f"the program must be a dspy.Module, got {type(program).__name__}")
        named = list(program.named_predictors())
        if not named:
            raise OptoValueError(f"{type(program).__name__} has no predictors (dspy.Predict, ChainOfThought, ...)")
        self.program = program
        self.instructions = {
            name: Parameter(
                predictor.signature.instructions,
                name=name,
                description=f"the instructions of the predictor {name!r} ({_fields(predictor.signature)})",
            )
            for name, predictor in named
        }
        # A program's own demos stay; these are the ones the search adds to them.
        self.demos = {name: Demos(max_demos=max_demos, name=f"{name}.demos") for name, _ in named} if demos else {}
        self._calls = _LMCalls()

    def program_with(self, values: dict[str, Any] | None = None) -> Any:
        """A copy of the program with `values` (by parameter name; default: the current ones)."""
        values = values if values is not None else self.parameter_values()
        program = self.program.deepcopy()  # its predictors copied, its LMs shared
        for name, predictor in program.named_predictors():
            if name in values:
                predictor.signature = predictor.signature.with_instructions(str(values[name]))
            if values.get(f"{name}.demos"):
                found = (_example_for(name, predictor, demo) for demo in values[f"{name}.demos"])
                predictor.demos = [*predictor.demos, *(d for d in found if d is not None)]
        return program

    def forward(self, inputs: dict[str, Any]) -> dict[str, Any]:  # run in a worker thread, with the run's context
        """The prediction's fields; with demos, also what each predictor saw and said
        (under `PREDICTORS`, the demos a successful run gives)."""
        program = self.program_with()
        callbacks = [*(getattr(dspy.settings, "callbacks", None) or []), self._calls]
        with dspy.context(callbacks=callbacks, trace=[]):
            prediction = program(**inputs)
            trace = list(dspy.settings.trace or [])
        output = dict(prediction.toDict()) if hasattr(prediction, "toDict") else {"output": prediction}
        if self.demos:
            names = {id(predictor): name for name, predictor in program.named_predictors()}
            output[PREDICTORS] = {
                names[id(predictor)]: {**dict(seen), **dict(said.toDict())}
                for predictor, seen, said in trace
                if id(predictor) in names
            }
        return output


class MetricGuide(Guide):
    """A DSPy metric as an opto guide: `metric(example, prediction)` gives the score; a
    result with `score` and `feedback` (GEPA's convention) also gives the feedback."""

    def __init__(self, metric: Callable[..., Any], input_keys: Sequence[str]) -> None:
        self.metric = metric
        self.input_keys = list(input_keys)

    def get_feedback(self, x: Any, output: Any, info: Any) -> Feedback:
        example = dspy.Example(**(info or {})).with_inputs(*self.input_keys)
        fields = {k: v for k, v in output.items() if k != PREDICTORS} if isinstance(output, dict) else output
        prediction = dspy.Prediction(**fields) if isinstance(fields, dict) else fields
        result = self.metric(example, prediction, None)
        score: Any
        feedback: Any
        if isinstance(result, (bool, int, float)):
            score, feedback = result, None
        elif isinstance(result, dict):
            score, feedback = result.get("score"), result.get("feedback")
        else:  # dspy.Prediction(score=..., feedback=...)
            score, feedback = getattr(result, "score", None), getattr(result, "feedback", None)
        if not isinstance(score, (int, float)):  # a bool is an int: True scores 1
            raise OptoTypeError(
                f"the metric returned {type(result).__name__}; it must return a number, a bool, or a "
                "dspy.Prediction(score=..., feedback=...)"
            )
        return Feedback(score=float(score), feedback=str(feedback or ""))


class OptoOptimizer(Teleprompter):
    """A DSPy teleprompter that runs opto's search: `compile(student, trainset=..., valset=None)`
    returns the optimized program, as DSPy's own optimizers do.

    Args:
        metric: DSPy's `metric(example, prediction, trace=None)`: a number, a bool, or a
            `dspy.Prediction(score=..., feedback=...)`.
        model: the optimizer's model: an opto `Model`, a `dspy.LM` (reached through
            LiteLLM with its model name and settings), or None (the program's LM:
            `dspy.settings.lm`).
        demos: also optimize each predictor's demos (`Demos`, proposed by `DemoProposer`
            from runs that scored 1: what each predictor saw and said in them).
        max_demos: demos per predictor.
        options: `AggregatedUpdate`'s keywords and `train()`'s (`run_dir`, `resume`,
            `budget`, `stop`, `batch_size`, `num_epochs`, `validation`, `proposals`, ...).

    `compile`'s `teacher` is not used (opto proposes from the student's own runs). After
    `compile`, `result` is opto's `TrainResult`; with `run_dir=`, the run's ledger is there.
    """

    def __init__(
        self, metric: Callable[..., Any], *, model: Any = None, demos: bool = False, max_demos: int = 4, **options: Any
    ) -> None:
        super().__init__()
        self.metric = metric
        self.model = model
        self.demos = demos
        self.max_demos = max_demos
        self.options = options
        self.result: TrainResult | None = None

    def compile(
        self,
        student: Any,
        *,
        trainset: Sequence[Any],
        teacher: Any = None,
        valset: Sequence[Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        trainer_options, train_options = split_options({**self.options, **kwargs}, "OptoOptimizer")
        agent = ProgramAgent(student, demos=self.demos, max_demos=self.max_demos)
        model = _optimizer_model(self.model)
        proposers: list[Any] = [Optimizer(model)]
        if self.demos:
            # A successful run's own predictor calls, as DSPy's bootstrapping takes them: a label
            # lacks the intermediate fields (a query, a reasoning) later predictors need.
            proposers.append(DemoProposer(source="successes"))
        train = _examples(trainset, "trainset")
        if valset and "validation" not in trainer_options:
            trainer_options["validation"] = _examples(valset, "valset")
        keys = _input_keys(trainset)
        trainer = AggregatedUpdate(agent, proposers, **trainer_options)
        try:
            self.result = trainer.train(MetricGuide(self.metric, keys), train, **{"progress": False, **train_options})
        finally:
            if model is not self.model:  # made here from a dspy.LM
                model.close()
        compiled = agent.program_with(self.result.final_parameters)
        compiled._compiled = True
        return compiled


def _optimizer_model(model: Any) -> Model:
    if isinstance(model, Model):
        return model
    lm = model if model is not None else dspy.settings.lm
    if lm is None:
        raise OptoValueError(
            "OptoOptimizer needs a model to propose with: pass model= (an opto Model or a dspy.LM), "
            "or configure the program's LM with dspy.configure(lm=...)"
        )
    if not isinstance(lm, dspy.LM):
        raise OptoTypeError(f"model must be an opto Model or a dspy.LM, got {type(lm).__name__}")
    settings = {k: v for k, v in (lm.kwargs or {}).items() if k in ("api_base", "api_key", "base_url", "api_version")}
    return LiteLLMModel(lm.model, **settings)


def _examples(rows: Sequence[Any], what: str) -> list[Example]:
    """DSPy examples as opto examples: x the inputs, info every field (labels too)."""
    found = []
    for index, row in enumerate(rows):
        if not isinstance(row, dspy.Example):
            raise OptoTypeError(f"{what}[{index}] must be a dspy.Example, got {type(row).__name__}")
        inputs = row.inputs().toDict()
        if not inputs:
            raise OptoValueError(
                f"{what}[{index}] has no input fields: build it with dspy.Example(...).with_inputs('question', ...)"
            )
        found.append(Example(inputs, row.toDict(), id=f"{what}-{index}"))
    return found


def _input_keys(rows: Sequence[Any]) -> list[str]:
    return list(rows[0].inputs().keys()) if rows else []


def _fields(signature: Any) -> str:
    return f"{', '.join(signature.input_fields)} -> {', '.join(signature.output_fields)}"


def _example_for(name: str, predictor: Any, demo: dict[str, Any]) -> Any:
    """A demo for `predictor`: what it saw and said in a successful run; None when the
    run did not call it (or a field of its signature is missing)."""
    said = demo.get("output")
    fields = said.get(PREDICTORS, {}).get(name) if isinstance(said, dict) else None
    needed = [*predictor.signature.input_fields, *predictor.signature.output_fields]
    if not fields or any(field not in fields for field in needed):
        return None
    return dspy.Example(**{field: fields[field] for field in needed})
