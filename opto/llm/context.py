"""What a run records about the code running in it, in one context variable.

A rollout records its model calls (the trace), the parameters its agent reads and the
usage of its calls (meters), and a model call marks itself as recorded by opto. All four
live in one small read-only `Records`: a `Scope` makes a new one for its block from the
one outside it, so a rollout opens its three records with one context change, and every
reader looks in one place. (Four variables, one per record, cost the same garbage
collection: BENCHMARKS.md, "Evaluation at scale".)

`Scope` is a plain object, not a generator `contextlib.contextmanager`: a generator costs
an object, two `next` calls and their frames on every entry. The hot paths (a rollout, a
model call) skip even that object: `open_records` and `close_records` around a `try`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from types import TracebackType
from typing import Any, Generic, TypeVar

# The records hold `tracing.LLMCall`s and `usage.UsageMeter`s, typed loosely here: both
# modules read this one, so naming their classes would make an import circle.
LLMCall = Any
UsageMeter = Any

T = TypeVar("T")

__all__ = ["Records", "Scope", "close_records", "current_records", "open_records"]


class Records:
    """The records the current code runs under (read-only: a scope makes a new one)."""

    __slots__ = ("trace", "reads", "meters", "by_opto")

    def __init__(
        self, trace: list[LLMCall] | None, reads: set[str] | None, meters: tuple[UsageMeter, ...], by_opto: bool
    ) -> None:
        self.trace = trace  # the innermost `record_llm_calls` list
        self.reads = reads  # the innermost `track_reads` set
        self.meters = meters  # every enclosing `meter_usage` meter, outermost first
        self.by_opto = by_opto  # inside a model call that opto records itself


_OUTSIDE_ANY_SCOPE = Records(None, None, (), False)  # never changed: a scope makes a new one
_RECORDS: contextvars.ContextVar[Records] = contextvars.ContextVar("opto_records", default=_OUTSIDE_ANY_SCOPE)


current_records: Callable[[], Records] = _RECORDS.get  # the records the current code runs under


def open_records(
    trace: list[LLMCall] | None = None,
    reads: set[str] | None = None,
    meter: UsageMeter | None = None,
    by_opto: bool = False,
) -> contextvars.Token[Records]:
    """Record into what is given from now on (the rest as before); `close_records` with
    the returned token ends it. `Scope` is the `with` form."""
    outside = _RECORDS.get()
    return _RECORDS.set(
        Records(
            outside.trace if trace is None else trace,
            outside.reads if reads is None else reads,
            outside.meters if meter is None else (*outside.meters, meter),
            outside.by_opto or by_opto,
        )
    )


def close_records(token: contextvars.Token[Records]) -> None:
    """Record as before the `open_records` that returned `token`."""
    _RECORDS.reset(token)


class Scope(Generic[T]):
    """A `with` block that records into what it is given (the rest as outside it), and
    gives `result` to `with ... as`. Scopes nest: the innermost trace and reads win, and
    every enclosing meter counts."""

    __slots__ = ("_trace", "_reads", "_meter", "_by_opto", "_result", "_token")

    def __init__(
        self,
        result: T,
        *,
        trace: list[LLMCall] | None = None,
        reads: set[str] | None = None,
        meter: UsageMeter | None = None,
        by_opto: bool = False,
    ) -> None:
        self._trace = trace
        self._reads = reads
        self._meter = meter
        self._by_opto = by_opto
        self._result = result

    def __enter__(self) -> T:
        self._token = open_records(self._trace, self._reads, self._meter, self._by_opto)
        return self._result

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        _RECORDS.reset(self._token)
