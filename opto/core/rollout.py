"""Running an agent and its guide on one example, with given parameter values."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, field_serializer
from pydantic_core import PydanticSerializationError

from .._util.async_tools import gather_all
from .._util.files import json_key
from ..errors import OptoValueError
from ..llm.context import close_records, open_records
from ..llm.errors import BudgetExceeded, describe_error
from ..llm.tracing import LLMCall
from ..llm.usage import UsageMeter, run_budgets
from .agent import Agent, run_agent
from .data import Example
from .guides import Guide
from .parameters import ParameterValues, assign

__all__ = [
    "MetricCallsSpent",
    "Rollout",
    "RolloutCounter",
    "RolloutFields",
    "admit_rollouts",
    "count_rollouts",
    "digest_of",
    "uncounted",
    "mean_score",
    "run_rollout",
    "rollout_done",
    "run_rollouts",
    "timeout_fields",
    "values_digest",
]

logger = logging.getLogger(__name__)


class RolloutFields(BaseModel):
    """What one run of agent and guide produced (shared by `Rollout` and its ledger event)."""

    x: Any = None
    info: Any = None
    output: Any = None
    score: float | None = None
    feedback: str = ""
    trace: list[dict[str, Any]] = Field(default_factory=list)
    error: str | None = None
    # Which parameter values the agent ran under (a digest of its trainable values): rollouts
    # of one example with the same digest ran the same policy.
    values_hash: str | None = None
    # What the run of agent and guide used: paid tokens, their cost, and its wall time
    # (the "cost" and "latency" objectives of `selection="pareto"`).
    tokens: int | None = None
    cost_usd: float | None = None
    seconds: float | None = None

    @field_serializer("x", "info", "output", mode="wrap", when_used="json")
    def _as_json(self, value: Any, handler: SerializerFunctionWrapHandler) -> Any:
        """An agent's own objects (a DSPy prediction, a trajectory) written as JSON where
        they have a JSON form, else as their text: the ledger never fails on them."""
        try:
            return handler(value)
        except PydanticSerializationError:
            return readable_json(value)


class Rollout(RolloutFields):
    """One run of the agent and the guide on one example.

    `error` is set when the agent or the guide raised; the score is then the trainer's
    `min_score` (None unless given) and the error is the feedback.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    example_id: str
    # Names of the parameters the agent read during this run (not written to the ledger).
    parameters_read: list[str] = Field(default_factory=list, exclude=True, repr=False)

    @property
    def failed(self) -> bool:
        return self.error is not None

    def to_record(self) -> dict[str, Any]:
        """The rollout as `RolloutEvent` fields (`instance_id` links it to proposals and candidates)."""
        record = self.model_dump(mode="json")
        record["instance_id"] = record.pop("example_id")
        return record


class MetricCallsSpent(BudgetExceeded):
    """Rollouts refused before they ran: they would pass the run's metric-call limit
    (`MaxMetricCalls`); the run ends its search and returns as a finished one does."""


class RolloutCounter:
    """How many rollouts (runs of agent and guide: GEPA's "metric calls") a block made;
    with a `limit`, a group of rollouts that would pass it is refused before it runs."""

    def __init__(self, limit: int | None = None) -> None:
        self.count = 0
        self.limit = limit

    def admit(self, n: int) -> None:
        """Raise `MetricCallsSpent` when `n` more rollouts would pass the limit."""
        if self.limit is not None and self.count + n > self.limit:
            raise MetricCallsSpent(
                f"{n} more rollouts would pass the {self.limit} metric calls left ({self.count} made)"
            )


_COUNTERS: contextvars.ContextVar[tuple[RolloutCounter, ...]] = contextvars.ContextVar(
    "opto_rollout_counters", default=()
)


@contextlib.contextmanager
def count_rollouts(limit: int | None = None) -> Iterator[RolloutCounter]:
    """Count the rollouts run inside the block, failed and timed-out ones too, not those a
    stop cancelled (they have no result; counters nest); with `limit`, refuse those that
    would pass it (`RolloutCounter.admit`)."""
    counter = RolloutCounter(limit)
    token = _COUNTERS.set((*_COUNTERS.get(), counter))
    try:
        yield counter
    finally:
        _COUNTERS.reset(token)


@contextlib.contextmanager
def uncounted() -> Iterator[None]:
    """Rollouts inside the block are not metric calls (a test-set evaluation)."""
    token = _COUNTERS.set(())
    try:
        yield
    finally:
        _COUNTERS.reset(token)


def admit_rollouts(n: int) -> None:
    """Before `n` rollouts run: `MetricCallsSpent` when they would pass a counter's limit."""
    for counter in _COUNTERS.get():
        counter.admit(n)


def rollouts_left() -> int | None:
    """The rollouts the enclosing counters still admit (None: no limit)."""
    left = [counter.limit - counter.count for counter in _COUNTERS.get() if counter.limit is not None]
    return max(0, min(left)) if left else None


def rollout_done() -> None:
    """Count one rollout in every enclosing `count_rollouts` block (an executor whose
    rollouts run in other processes calls it as each comes back)."""
    for counter in _COUNTERS.get():
        counter.count += 1


def readable_json(value: Any, depth: int = 0) -> Any:
    """`value` as JSON values: pydantic models dumped, `toDict()` objects (DSPy's) as their
    dicts, containers item by item, anything else as its text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if depth > 32:
        return str(value)
    if isinstance(value, BaseModel):
        try:
            return value.model_dump(mode="json")
        except PydanticSerializationError:
            return readable_json(dict(value), depth + 1)
    if isinstance(value, dict):
        return {str(k): readable_json(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [readable_json(v, depth + 1) for v in value]
    to_dict = getattr(value, "toDict", None)
    if callable(to_dict):
        try:
            return readable_json(to_dict(), depth + 1)
        except Exception:  # an object's own conversion failed: its text will do
            return str(value)
    return str(value)


def mean_score(rollouts: Sequence[Rollout]) -> float | None:
    """Mean of the scores that exist; None when no rollout could be judged."""
    scores = [r.score for r in rollouts if r.score is not None]
    return float(np.mean(scores)) if scores else None


async def run_rollout(
    agent: Agent,
    guide: Guide,
    example: Example,
    *,
    values: ParameterValues | None = None,
    min_score: float | None = None,
    timeout: float | None = None,
) -> Rollout:
    """Run `agent` on `example` under `values` (none: the stored values) and judge it.

    Agent and guide exceptions become a failed rollout, and so does a run of agent and
    guide longer than `timeout` seconds (a sync agent's thread cannot be stopped: it
    finishes in the background, its result unused). `BudgetExceeded` propagates,
    because it means the run must stop, not that this example failed.
    """
    admit_rollouts(1)
    with _assigned(values):
        return await _run_one(agent, guide, example, min_score, timeout, lambda: values_digest(agent))


_NO_VALUES = contextlib.nullcontext()  # stateless: one serves every rollout without values


def _assigned(values: ParameterValues | None) -> contextlib.AbstractContextManager[None]:
    return assign(values) if values else _NO_VALUES


async def _run_one(
    agent: Agent,
    guide: Guide,
    example: Example,
    min_score: float | None,
    timeout: float | None,
    digest: Callable[[], str],
) -> Rollout:
    """`run_rollout` under the values assigned around it, their digest given by `digest`."""
    started = time.perf_counter()
    values_hash = digest()  # before tracking: the digest is not the agent's read
    trace: list[LLMCall] = []
    reads: set[str] = set()
    meter = UsageMeter()
    records = open_records(trace, reads, meter)  # the three records at once: one context change per rollout
    try:
        if timeout is None:
            fields = await _agent_then_guide(agent, guide, example, min_score)
        else:
            try:
                fields = await asyncio.wait_for(_agent_then_guide(agent, guide, example, min_score), timeout)
            except TimeoutError:
                logger.debug("rollout on %s timed out after %s s", example.id, timeout)
                fields = timeout_fields(timeout, min_score)
    finally:
        close_records(records)
    rollout_done()  # a rollout with a result: one that a stop cancelled made none to record
    for budget in run_budgets():  # calls seen after the fact (OpenTelemetry spans) used it up
        if budget.overrun is not None:
            raise BudgetExceeded(budget.overrun)
    fields["tokens"], fields["cost_usd"] = meter.tokens_and_cost()
    fields["example_id"] = example.id or ""
    fields["x"], fields["info"], fields["values_hash"] = example.x, example.info, values_hash
    fields["trace"] = trace  # validation copies it: a task the agent left running cannot add to it
    fields["parameters_read"] = sorted(reads)
    fields["seconds"] = round(time.perf_counter() - started, 6)
    return Rollout.__pydantic_validator__.validate_python(fields)  # model_validate without its wrapper


def timeout_fields(timeout: float | None, min_score: float | None) -> dict[str, Any]:
    """A rollout's score, feedback and error when it ran past `timeout` seconds."""
    limit = f"rollout_timeout={timeout:g} s" if timeout is not None else "its rollout_timeout"
    error = f"timeout: the agent and guide took longer than {limit}"
    return {"score": min_score, "feedback": f"The run was stopped: {error}", "error": error}


def values_digest(agent: Agent) -> str:
    """A short digest of the trainable values `agent` sees now (assignments included)."""
    return digest_of({p.name: p.current_value() for p in agent.parameters(trainable_only=True)})


def digest_of(values: Mapping[Any, Any]) -> str:
    """The digest of trainable `values` ({name: value}), as a rollout run under them
    records it (`Rollout.values_hash`)."""
    return hashlib.sha256(json_key(dict(values)).encode()).hexdigest()[:12]


class _BatchDigest:
    """`values_digest` for the rollouts of one batch, which all run under the same
    assignment: the agent's parameters are found once, and the digest is computed again
    only after a stored value changed (a write bumps its parameter's version)."""

    def __init__(self, agent: Agent) -> None:
        self._agent = agent
        self._parameters = agent.parameters(trainable_only=True)
        self._known: dict[tuple[int, ...], str] = {}

    def __call__(self) -> str:
        versions = tuple([p._version for p in self._parameters])
        found = self._known.get(versions)
        if found is None:
            found = self._known[versions] = values_digest(self._agent)
        return found


async def _agent_then_guide(agent: Agent, guide: Guide, example: Example, min_score: float | None) -> dict[str, Any]:
    """The rollout's fields after running the agent, then the guide on its output."""
    try:
        output = await run_agent(agent, example.x)
    except BudgetExceeded:
        raise
    except Exception as exc:  # the agent's failure is data for the trainer
        logger.debug("agent failed on %s: %r", example.id, exc)
        problem = describe_error(exc)
        return {"score": min_score, "feedback": f"The agent raised {problem}", "error": f"agent: {problem}"}
    try:
        feedback = await guide.aget_feedback(example.x, output, example.info)
    except BudgetExceeded:
        raise
    except Exception as exc:
        logger.debug("guide failed on %s: %r", example.id, exc)
        problem = describe_error(exc)
        return {
            "output": output,
            "score": min_score,
            "feedback": f"The guide raised {problem}",
            "error": f"guide: {problem}",
        }
    return {"output": output, "score": feedback.score, "feedback": feedback.feedback}


async def run_rollouts(
    agent: Agent,
    guide: Guide,
    examples: Sequence[Example],
    *,
    values: ParameterValues | None = None,
    min_score: float | None = None,
    concurrency: int = 16,
    timeout: float | None = None,
    on_result: Callable[[Rollout], None] | None = None,
) -> list[Rollout]:
    """`run_rollout` on every example, at most `concurrency` at once, in input order;
    `on_result` is called with each rollout as it finishes (e.g. for a progress bar)."""
    if concurrency < 1:
        raise OptoValueError(f"concurrency must be >= 1, got {concurrency}")
    admit_rollouts(len(examples))
    digest = _BatchDigest(agent)
    results: list[Rollout | None] = [None] * len(examples)
    todo = iter(enumerate(examples))

    # `concurrency` workers take the next example when one is done: nothing waits per
    # example, however large the dataset, and no task is made per rollout (a task that
    # lives as long as a model call costs more garbage collection than the rest of the
    # rollout). A worker's rollouts share its context: opto's scopes are reset when
    # each rollout ends, and so must be a context variable that an agent sets.
    async def worker() -> None:
        for index, example in todo:
            rollout = await _run_one(agent, guide, example, min_score, timeout, digest)
            results[index] = rollout
            if on_result is not None:
                on_result(rollout)

    with _assigned(values):  # once for the batch (checked once), not once a rollout
        await gather_all(worker() for _ in range(min(concurrency, len(examples))))
    return results  # type: ignore[return-value]  # every index was filled
