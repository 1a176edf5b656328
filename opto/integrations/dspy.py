"""opto's search as a DSPy teleprompter: `OptoOptimizer(metric).compile(program, trainset=...)`.

Each predictor's instructions (and, with `demos=True`, its demos) become opto
`Parameter`s; the program runs as the agent, each rollout on a copy carrying the values
under test, with the example's own values (pydantic models, `dspy.History`, images) as
it gets them from DSPy; the metric becomes the guide, and a metric that returns a score
with feedback text (GEPA's `dspy.Prediction(score=..., feedback=...)`) gives that text to
the optimizer. A program that raises (a reply that does not parse) scores `failure_score`
with the error as feedback, as DSPy's optimizers score it. A GEPA-style five-argument
metric is also asked, when a step proposes, for each updated predictor's own feedback
(`pred_name`, `pred_trace`). Every LM call the program makes lands in the rollout's trace
and the run's usage: DSPy 3 may send calls through its native clients rather than
LiteLLM, so they are seen through DSPy's own callbacks (`on_lm_start`/`on_lm_end`),
which see every backend.

`OptoOptimizer` takes `dspy.GEPA`'s keywords (`auto`, `max_metric_calls`,
`reflection_lm`, `num_threads`, ...), each mapped to opto's equivalent or refused with why
when it is made.

`dspy` is an optional extra (`pip install "opto-agents[dspy]"`), imported with this module.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..core.agent import Agent
from ..core.data import Example
from ..core.guides import Feedback, Guide
from ..core.parameters import Demos, Parameter
from ..core.rollout import Rollout
from ..errors import MissingDependencyError, OptoTypeError, OptoValueError
from ..llm.base import Model
from ..llm.errors import BudgetExceeded, LLMError, describe_error
from ..llm.instrument import count_and_record
from ..llm.prices import known_price
from ..llm.types import Completion, Message, TokenUsage, validate_messages
from ..llm.usage import estimated_usage
from ..run.results import TrainResult
from ..search.proposers import DemoProposer, Optimizer, Proposal, _editable
from ..trainer.aggregated import AggregatedUpdate
from ._options import TRACKING, apply_gepa_search, refuse_unmapped, split_options

try:
    import dspy
    from dspy.teleprompt import Teleprompter
    from dspy.utils.callback import BaseCallback
except ImportError as exc:  # pragma: no cover - the extra is installed where this module is used
    raise MissingDependencyError('opto.integrations.dspy needs DSPy 3: pip install "opto-agents[dspy]"') from exc

__all__ = ["DSPyLM", "MetricGuide", "OptoOptimizer", "ProgramAgent", "ProgramOutput", "ProgramReflection"]

logger = logging.getLogger(__name__)

#: The output key under which a rollout keeps each predictor's inputs and outputs (demos).
PREDICTORS = "_predictors"

#: The parameter name of a program that is itself one predictor (DSPy names it "self").
WHOLE_PROGRAM = "program"


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
        if not isinstance(entry, Mapping):
            continue
        outputs = [_text(o) for o in (entry.get("outputs") or [])]
        if entry.get("messages") == messages and outputs == texts:
            found = entry.get("usage") or {}
            if isinstance(found, Mapping) and found.get("prompt_tokens") is not None:
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


class ProgramOutput(dict[str, Any]):
    """A prediction's fields, as the program made them (its own types), with what the run
    did beside them: `trace` (each predictor's (name, inputs, prediction)) and `failure`
    (what the program raised, None when it answered). Written to the ledger as a dict."""

    trace: list[tuple[str, dict[str, Any], Any]]
    failure: str | None

    def __init__(self, fields: Mapping[str, Any], trace: list[tuple[str, dict[str, Any], Any]], failure: str | None):
        super().__init__(fields)
        self.trace = trace
        self.failure = failure


class ProgramAgent(Agent):
    """A DSPy program as an opto agent: `{predictor name}` is a text `Parameter` holding
    that predictor's instructions (and `{predictor name}.demos` a `Demos` with its demos);
    a program that is one predictor has the parameter `program`. `forward(inputs)` runs a
    copy of the program carrying the current values and returns a `ProgramOutput`.

    Args:
        program: the `dspy.Module`.
        demos: also optimize each predictor's demos.
        max_demos: demos per predictor.
        num_threads: programs run at once (DSPy's `num_threads`), each in its own thread.
    """

    def __init__(self, program: Any, *, demos: bool = False, max_demos: int = 4, num_threads: int = 16) -> None:
        if not isinstance(program, dspy.Module):
            raise OptoTypeError(f"the program must be a dspy.Module, got {type(program).__name__}")
        named = [(_name(name), predictor) for name, predictor in program.named_predictors()]
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
        self._threads = concurrent.futures.ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="opto-dspy")

    def program_with(self, values: dict[str, Any] | None = None) -> Any:
        """A copy of the program with `values` (by parameter name; default: the current ones)."""
        values = values if values is not None else self.parameter_values()
        program = self.program.deepcopy()  # its predictors copied, its LMs shared
        for raw, predictor in program.named_predictors():
            name = _name(raw)
            if name in values:
                predictor.signature = predictor.signature.with_instructions(str(values[name]))
            if values.get(f"{name}.demos"):
                found = (_example_for(name, predictor, demo) for demo in values[f"{name}.demos"])
                predictor.demos = [*predictor.demos, *(d for d in found if d is not None)]
        return program

    async def arun(self, x: Any) -> Any:
        """`forward` in the agent's own threads (as many as `num_threads`), with the run's context."""
        context = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(self._threads, context.run, self.forward, x)

    def forward(self, inputs: dict[str, Any]) -> ProgramOutput:
        """The prediction's fields (with demos, also what each predictor saw and said, under
        `PREDICTORS`); what the program raised is the output's `failure`."""
        program = self.program_with()
        callbacks = [*(getattr(dspy.settings, "callbacks", None) or []), self._calls]
        names = {id(predictor): _name(name) for name, predictor in program.named_predictors()}
        with dspy.context(callbacks=callbacks, trace=[]):
            try:
                prediction = program(**inputs)
                failure = None
            except (BudgetExceeded, KeyboardInterrupt):
                raise
            except Exception as exc:  # a reply that does not parse, a tool that raised: a scored failure
                prediction, failure = None, describe_error(exc)
            trace = [
                (names[id(predictor)], dict(seen), said)
                for predictor, seen, said in list(dspy.settings.trace or [])
                if id(predictor) in names
            ]
        fields = _fields_of(prediction) if failure is None else {}
        if self.demos and failure is None:
            fields[PREDICTORS] = {name: {**seen, **_fields_of(said)} for name, seen, said in trace}
        return ProgramOutput(fields, trace, failure)

    def close(self) -> None:
        """Stop the agent's threads."""
        self._threads.shutdown(wait=False)


def _fields_of(prediction: Any) -> dict[str, Any]:
    """A prediction's fields as the program made them (no conversion to dicts)."""
    if isinstance(prediction, (dspy.Prediction, dspy.Example)):
        return {key: prediction[key] for key in prediction.keys()}
    return {"output": prediction}


def _name(name: str) -> str:
    return WHOLE_PROGRAM if name == "self" else name


class MetricGuide(Guide):
    """A DSPy metric as an opto guide: `metric(example, prediction)` gives the score; a
    result with `score` and `feedback` (GEPA's convention) also gives the feedback. A
    program that raised scores `failure_score`, its error the feedback."""

    def __init__(
        self,
        metric: Callable[..., Any],
        input_keys: Sequence[str],
        *,
        failure_score: float = 0.0,
        error_feedback: bool = True,
    ) -> None:
        self.metric = metric
        self.input_keys = list(input_keys)
        self.failure_score = failure_score
        self.error_feedback = error_feedback
        self.per_predictor = _takes_five(metric)

    def gold(self, info: Any) -> Any:
        return dspy.Example(**(info or {})).with_inputs(*self.input_keys)

    def get_feedback(self, x: Any, output: Any, info: Any) -> Feedback:
        failure = getattr(output, "failure", None)
        if failure is not None:
            said = f"The program raised {failure}" if self.error_feedback else "The program's reply could not be used."
            return Feedback(score=self.failure_score, feedback=said)
        return self.judge(info, output)

    def judge(self, info: Any, output: Any, pred_name: str | None = None, pred_trace: Any = None) -> Feedback:
        """The metric on one prediction (for one predictor, with `pred_name`)."""
        fields = {k: v for k, v in output.items() if k != PREDICTORS} if isinstance(output, dict) else output
        prediction = dspy.Prediction(**fields) if isinstance(fields, dict) else fields
        if self.per_predictor:
            result = self.metric(self.gold(info), prediction, None, pred_name, pred_trace)
        else:
            result = self.metric(self.gold(info), prediction, None)
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


def _takes_five(metric: Callable[..., Any]) -> bool:
    """Whether `metric` takes GEPA's (gold, pred, trace, pred_name, pred_trace)."""
    try:
        inspect.signature(metric).bind(None, None, None, None, None)
    except (TypeError, ValueError):
        return False
    return True


class ProgramReflection(Optimizer):
    """opto's reflective `Optimizer` with a GEPA-style metric's per-predictor feedback:
    when a step proposes, the metric is asked, for each predictor the step updates and
    each rollout the prompt shows, with that predictor's name and its calls in the run
    (`pred_name`, `pred_trace`), and its feedback is added to the rollout's."""

    def __init__(self, model: Model, guide: MetricGuide, **settings: Any) -> None:
        super().__init__(model, **settings)
        self.guide = guide

    async def propose_batch(self, parameters: Sequence[Parameter], rollouts: Sequence[Rollout]) -> list[Proposal]:
        names = {str(p.name) for p in parameters if _editable(p)}
        if self.guide.per_predictor and names and not all(self.went_right(r) for r in rollouts):
            # Only the failures the prompt shows are asked about (the metric may be an LLM judge).
            shown = {id(r) for r in [r for r in rollouts if not self.went_right(r)][: self.max_examples]}
            rollouts = await asyncio.to_thread(
                lambda: [self._with_predictor_feedback(r, names) if id(r) in shown else r for r in rollouts]
            )
        return await super().propose_batch(parameters, rollouts)

    def _with_predictor_feedback(self, rollout: Rollout, names: set[str]) -> Rollout:
        output = rollout.output
        if not isinstance(output, ProgramOutput) or output.failure is not None or self.went_right(rollout):
            return rollout
        said = []
        for name in sorted(names & {n for n, _, _ in output.trace}):
            pred_trace = [(n, seen, out) for n, seen, out in output.trace if n == name]
            try:
                found = self.guide.judge(rollout.info, output, name, pred_trace)
            except Exception as exc:  # the feedback is a help: the step goes on without it
                logger.debug("the metric's feedback for %s failed: %s", name, describe_error(exc))
                continue
            if found.feedback and found.feedback != rollout.feedback:
                said.append(f"[{name}] {found.feedback}")
        if not said:
            return rollout
        return rollout.model_copy(update={"feedback": "\n".join([rollout.feedback, *said]).strip()})


class DSPyLM(Model):
    """A DSPy LM (`dspy.LM`, `DummyLM`, any `BaseLM`) as opto's optimizer model: called as
    the program calls it, with every setting it was made with (temperature, top_p,
    max_tokens, headers, api_base, caching); opto's own temperature and token limit are
    sent only where the LM sets none."""

    def __init__(self, lm: Any) -> None:
        super().__init__(str(getattr(lm, "model", "dspy-lm")))
        self.lm = lm

    async def _generate(self, messages: list[Message], **kwargs: Any) -> Completion:
        own = getattr(self.lm, "kwargs", None) or {}
        sent: dict[str, Any] = {}
        for key in ("temperature", "max_tokens"):
            if kwargs.get(key) is not None and own.get(key) is None:
                sent[key] = kwargs[key]
        if kwargs.get("n", 1) > 1:
            sent["n"] = kwargs["n"]
        # One prompt (DSPy's supported call; its messages= form is going away in DSPy 3.5).
        prompt = "\n\n".join(str(m.get("content") or "") for m in messages)
        plain = [{"role": "user", "content": prompt}]
        try:
            outputs = await asyncio.to_thread(self.lm, prompt, **sent)
        except (BudgetExceeded, LLMError):
            raise
        except Exception as exc:
            raise LLMError(f"the DSPy LM {self.name!r} failed: {describe_error(exc)}") from exc
        texts = [_text(o) for o in (outputs or [])] or [""]
        return Completion(texts=texts, usage=_usage(self.lm, plain, texts), model=self.name)


class OptoOptimizer(Teleprompter):
    """A DSPy teleprompter that runs opto's search: `compile(student, trainset=..., valset=None)`
    returns the optimized program, as DSPy's own optimizers do.

    Args:
        metric: DSPy's `metric(example, prediction, trace=None)`, or GEPA's five-argument
            `metric(gold, pred, trace, pred_name, pred_trace)`: a number, a bool, or a
            `dspy.Prediction(score=..., feedback=...)`.
        model: the optimizer's model: an opto `Model`, a DSPy LM (called with its own
            settings), or None (`reflection_lm`, else the program's LM: `dspy.settings.lm`).
        demos: also optimize each predictor's demos (`Demos`, proposed by `DemoProposer`
            from runs that scored 1: what each predictor saw and said in them).
        max_demos: demos per predictor.
        options: `dspy.GEPA`'s keywords, each mapped to opto's (`auto`, `max_full_evals`,
            `max_metric_calls`, `reflection_lm`, `reflection_minibatch_size`,
            `candidate_selection_strategy`, `skip_perfect_score`, `perfect_score`,
            `failure_score`, `add_format_failure_as_feedback`, `component_selector`,
            `use_merge`, `num_threads`, `log_dir`, `track_stats`, `seed`, ...), and
            `AggregatedUpdate`'s and `train()`'s (`run_dir`, `resume`, `budget`, `stop`,
            `batch_size`, `num_epochs`, `validation`, `proposals`, ...). An unknown one, or a
            GEPA one with no equivalent, is refused here.

    `compile`'s `teacher` is not used (opto proposes from the student's own runs). After
    `compile`, `result` is opto's `TrainResult`; with `run_dir=` (or `log_dir=`), the run's
    ledger is there.
    """

    def __init__(
        self, metric: Callable[..., Any], *, model: Any = None, demos: bool = False, max_demos: int = 4, **options: Any
    ) -> None:
        super().__init__()
        self.metric = metric
        self.demos = demos
        self.max_demos = max_demos
        self.gepa = {k: options.pop(k) for k in list(options) if k in DSPY_GEPA}
        _refuse_unmapped(self.gepa)
        if model is not None and self.gepa.get("reflection_lm") is not None:
            raise OptoValueError("give model= or reflection_lm= (dspy.GEPA's name for it), not both")
        self.model = model if model is not None else self.gepa.get("reflection_lm")
        budgets = [k for k in ("auto", "max_full_evals", "max_metric_calls") if self.gepa.get(k) is not None]
        if len(budgets) > 1:
            raise OptoValueError(f"give one of auto, max_full_evals, max_metric_calls, not {' and '.join(budgets)}")
        if self.gepa.get("auto") is not None and self.gepa["auto"] not in AUTO_CANDIDATES:
            raise OptoValueError(
                f"auto must be one of {', '.join(map(repr, AUTO_CANDIDATES))}, got {self.gepa['auto']!r}"
            )
        if "log_dir" in self.gepa and "run_dir" in options:
            raise OptoValueError("give log_dir= or run_dir= (opto's name for it), not both")
        split_options(options, "OptoOptimizer")  # an unknown option is refused now, not at compile()
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
        gepa = self.gepa
        agent = ProgramAgent(
            student, demos=self.demos, max_demos=self.max_demos, num_threads=int(gepa.get("num_threads") or 16)
        )
        if gepa.get("num_threads"):
            trainer_options.setdefault("concurrency", int(gepa["num_threads"]))
        train = _examples(trainset, "trainset")
        validation = _examples(valset, "valset") if valset else []
        if validation and "validation" not in trainer_options:
            trainer_options["validation"] = validation
        keys = _input_keys(trainset)
        guide = MetricGuide(
            self.metric,
            keys,
            failure_score=float(gepa.get("failure_score", 0.0)),
            error_feedback=bool(gepa.get("add_format_failure_as_feedback", True)),
        )
        _apply_gepa_options(gepa, trainer_options, train_options, student, len(train), len(validation))
        model = _optimizer_model(self.model)
        perfect = float(gepa.get("perfect_score", 1.0)) if gepa.get("skip_perfect_score", True) else float("inf")
        proposers: list[Any] = [ProgramReflection(model, guide, perfect_score=perfect)]
        if self.demos:
            # A successful run's own predictor calls, as DSPy's bootstrapping takes them: a label
            # lacks the intermediate fields (a query, a reasoning) later predictors need.
            proposers.append(DemoProposer(source="successes"))
        trainer = AggregatedUpdate(agent, proposers, **trainer_options)
        try:
            self.result = trainer.train(guide, train, **{"progress": False, **train_options})
        finally:
            agent.close()
            if model is not self.model:  # made here from a DSPy LM
                model.close()
        compiled = agent.program_with(self.result.final_parameters)
        compiled._compiled = True
        if gepa.get("track_stats"):
            compiled.detailed_results = self.result
        return compiled


#: `dspy.GEPA`'s keywords (dspy 3.4.1) that `OptoOptimizer` takes.
DSPY_GEPA = (
    "auto", "max_full_evals", "max_metric_calls", "reflection_minibatch_size", "candidate_selection_strategy",
    "reflection_lm", "skip_perfect_score", "add_format_failure_as_feedback", "instruction_proposer",
    "code_proposer", "component_selector", "use_merge", "max_merge_invocations", "num_threads", "failure_score",
    "perfect_score", "log_dir", "track_stats", "use_wandb", "wandb_api_key", "wandb_init_kwargs",
    "track_best_outputs", "warn_on_score_mismatch", "use_mlflow", "gepa_kwargs",
)  # fmt: skip

#: dspy.GEPA's keywords opto has no equivalent for: the values accepted (their default), and why.
NO_EQUIVALENT: dict[str, tuple[tuple[Any, ...], str]] = {
    "instruction_proposer": ((None,), "opto's reflection writes the instructions; pass model= to choose its LM"),
    "code_proposer": ((None,), "opto optimizes instructions and demos, not a dspy.Flex module's code"),
    "max_merge_invocations": ((5,), "opto merges every few steps of a pool run (use_merge=True), with no cap"),
    "use_wandb": ((False,), TRACKING),
    "wandb_api_key": ((None,), TRACKING),
    "wandb_init_kwargs": ((None,), TRACKING),
    "use_mlflow": ((False,), TRACKING),
    "track_best_outputs": ((False,), "opto keeps every rollout's output in the run's ledger (run_dir=)"),
    "gepa_kwargs": ((None,), "opto runs its own search, not gepa.optimize: pass opto's options by name"),
}

#: `auto`'s candidate counts, as dspy.GEPA sizes its metric-call budget with them.
AUTO_CANDIDATES = {"light": 6, "medium": 12, "heavy": 18}


def _refuse_unmapped(given: Mapping[str, Any]) -> None:
    refuse_unmapped(given, NO_EQUIVALENT, "OptoOptimizer")
    if given.get("candidate_selection_strategy", "pareto") not in ("pareto", "current_best"):
        raise OptoValueError("candidate_selection_strategy must be 'pareto' or 'current_best'")
    if given.get("component_selector", "round_robin") not in ("round_robin", "all"):
        raise OptoValueError(
            "component_selector must be 'round_robin' or 'all' (an opto ComponentSelector: components=)"
        )


def metric_call_budget(gepa: Mapping[str, Any], student: Any, n_train: int, n_val: int) -> int | None:
    """The metric calls dspy.GEPA would run with these keywords (its own formula for `auto`)."""
    if gepa.get("max_metric_calls") is not None:
        return int(gepa["max_metric_calls"])
    if gepa.get("max_full_evals") is not None:
        return int(gepa["max_full_evals"]) * (n_train + n_val)
    if gepa.get("auto") is not None:
        return int(
            dspy.GEPA.auto_budget(
                None,
                num_preds=max(len(list(student.named_predictors())), 1),
                num_candidates=AUTO_CANDIDATES[gepa["auto"]],
                valset_size=n_val or n_train,
            )
        )
    return None


def _apply_gepa_options(
    gepa: Mapping[str, Any], trainer: dict[str, Any], train: dict[str, Any], student: Any, n_train: int, n_val: int
) -> None:
    """dspy.GEPA's keywords as opto's options (the trainer's and `train()`'s)."""
    strategy = gepa.get("candidate_selection_strategy")
    if strategy is not None:
        trainer.setdefault("selection", "pareto" if strategy == "pareto" else "greedy")
    if gepa.get("failure_score") is not None:
        train.setdefault("min_score", float(gepa["failure_score"]))
    if gepa.get("log_dir") is not None:
        train["run_dir"] = gepa["log_dir"]
        train.setdefault("resume", True)  # dspy.GEPA continues a run it finds in log_dir
    apply_gepa_search(trainer, train, n_train=n_train, components=gepa.get("component_selector"),
                      use_merge=bool(gepa.get("use_merge")), minibatch=gepa.get("reflection_minibatch_size"),
                      metric_calls=metric_call_budget(gepa, student, n_train, n_val))  # fmt: skip


def _optimizer_model(model: Any) -> Model:
    if isinstance(model, Model):
        return model
    lm = model if model is not None else dspy.settings.lm
    if lm is None:
        raise OptoValueError(
            "OptoOptimizer needs a model to propose with: pass model= (an opto Model or a dspy.LM), "
            "or configure the program's LM with dspy.configure(lm=...)"
        )
    if not isinstance(lm, dspy.BaseLM):
        raise OptoTypeError(f"model must be an opto Model or a DSPy LM (dspy.LM, BaseLM), got {type(lm).__name__}")
    return DSPyLM(lm)


def _examples(rows: Sequence[Any], what: str) -> list[Example]:
    """DSPy examples as opto examples: x the inputs, info every field (labels too), each
    value as the example holds it (a pydantic model stays one)."""
    found = []
    for index, row in enumerate(rows):
        if not isinstance(row, dspy.Example):
            raise OptoTypeError(f"{what}[{index}] must be a dspy.Example, got {type(row).__name__}")
        keys = list(row.inputs().keys())
        if not keys:
            raise OptoValueError(
                f"{what}[{index}] has no input fields: build it with dspy.Example(...).with_inputs('question', ...)"
            )
        found.append(Example({k: row[k] for k in keys}, {k: row[k] for k in row.keys()}, id=f"{what}-{index}"))
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
