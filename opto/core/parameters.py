"""Trainable parameters and the per-task assignment context.

`Parameter.value` first looks at an override map held in a `contextvars.ContextVar`
and only then at the parameter's stored value. `assign()` sets that map for the
current task (or thread, through `asyncio.to_thread`), so concurrent runs of one agent
with different values never see each other's values. Accepting an update is the only
thing that writes stored values.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from ..errors import OptoError, OptoTypeError
from ..llm.context import Scope, current_records

__all__ = ["Constraint", "Demos", "Parameter", "ParameterError", "assign", "current_assignment", "track_reads"]

#: Python types a parameter may hold; bool is checked before int because bool is an int.
SUPPORTED_TYPES: tuple[type, ...] = (bool, str, int, float, list, dict)

_OVERRIDES: contextvars.ContextVar[Mapping[Any, Any] | None] = contextvars.ContextVar(
    "opto_parameter_overrides", default=None
)


class ParameterError(OptoError, ValueError):
    """A value does not fit a parameter's type or constraint."""


@dataclass(frozen=True)
class Constraint:
    """What values a parameter may take.

    `text` is shown to the optimizer as is. The checks (`choices`, `min`, `max`,
    `max_length`, `check`) are enforced on every update and also described to the
    optimizer. `check` is a callable that returns True for an acceptable value.
    """

    text: str | None = None
    choices: tuple[Any, ...] | None = None
    min: float | None = None
    max: float | None = None
    max_length: int | None = None
    check: Callable[[Any], bool] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.choices is not None:
            object.__setattr__(self, "choices", tuple(self.choices))

    def describe(self) -> str:
        """The constraint as one line of text for a prompt ('' when there is none)."""
        parts = [self.text] if self.text else []
        if self.choices is not None:
            parts.append("one of " + json.dumps(list(self.choices)))
        if self.min is not None:
            parts.append(f">= {self.min}")
        if self.max is not None:
            parts.append(f"<= {self.max}")
        if self.max_length is not None:
            parts.append(f"length at most {self.max_length}")
        return "; ".join(parts)

    def violation(self, value: Any) -> str | None:
        """Why `value` breaks this constraint, or None when it does not."""
        if self.choices is not None and value not in self.choices:
            return f"{value!r} is not one of {list(self.choices)!r}"
        if self.min is not None and value < self.min:
            return f"{value!r} is below the minimum {self.min}"
        if self.max is not None and value > self.max:
            return f"{value!r} is above the maximum {self.max}"
        if self.max_length is not None and len(value) > self.max_length:
            return f"length {len(value)} is over the maximum {self.max_length}"
        if self.check is not None:
            try:
                ok = self.check(value)
            except Exception as exc:  # a user's check that raises rejects the value
                return f"the check raised {type(exc).__name__}: {exc}"
            if not ok:
                return f"{_short(value)} fails the parameter's check"
        return None


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _type_of(value: Any) -> type:
    for kind in SUPPORTED_TYPES:
        if isinstance(value, kind):
            return kind
    raise ParameterError(f"a Parameter holds str, int, float, bool, list or dict; got {type(value).__name__}")


class Parameter:
    """A typed value that the optimizer may change.

    Args:
        value: the initial value (str, int, float, bool, list or dict); its type is the
            parameter's type for its whole life.
        name: unique within an agent; defaults to the attribute path inside the agent.
        description: what the value is for, shown to the optimizer.
        trainable: False keeps the value fixed (it is still shown as context).
        constraint: text shown to the optimizer, a `Constraint` with checks that every
            update must pass, or a callable check.
    """

    def __init__(
        self,
        value: Any,
        *,
        name: str | None = None,
        description: str = "",
        trainable: bool = True,
        constraint: str | Constraint | Callable[[Any], bool] | None = None,
    ) -> None:
        self.type: type = _type_of(value)
        self.name = name
        self.description = description
        self.trainable = trainable
        if isinstance(constraint, str):
            constraint = Constraint(text=constraint)
        elif callable(constraint) and not isinstance(constraint, Constraint):
            constraint = Constraint(check=constraint)
        elif constraint is not None and not isinstance(constraint, Constraint):
            raise OptoTypeError(
                f"constraint is text, a Constraint or a callable returning whether a value fits, "
                f"not {type(constraint).__name__}"
            )
        self.constraint: Constraint | None = constraint
        self._value = self.validate(value)
        self._version = 0  # bumped by every write, so a digest of the values can be reused until one

    @property
    def value(self) -> Any:
        """The value seen by the current task: an assigned override, else the stored value.

        A list or dict is returned as a copy, so agent code that mutates it cannot change
        the stored value (accepting an update is the only write).
        """
        reads = current_records().reads
        if reads is not None and self.name is not None:
            reads.add(self.name)
        value = self.current_value()
        return copy.deepcopy(value) if isinstance(value, (list, dict)) else value

    @value.setter
    def value(self, new_value: Any) -> None:
        self._value = self.validate(new_value)
        self._version += 1

    def current_value(self) -> Any:
        """The value the current task sees, uncopied and not recorded as read: for opto's
        own bookkeeping (digests), which must neither pay for a copy nor count as a read."""
        overrides = _OVERRIDES.get()
        if overrides:
            if self in overrides:
                return overrides[self]
            if self.name is not None and self.name in overrides:
                return overrides[self.name]
        return self._value

    @property
    def stored_value(self) -> Any:
        """The stored value, ignoring any assignment context."""
        return self._value

    def describe_constraint(self) -> str:
        return self.constraint.describe() if self.constraint else ""

    def describe(self) -> dict[str, Any]:
        """What a prompt shows of this parameter: name, type, description, constraint, value."""
        return {
            "name": self.name,
            "type": self.type.__name__,
            "trainable": self.trainable,
            "description": self.description,
            "constraint": self.describe_constraint(),
            "value": self.value,
        }

    def validate(self, value: Any) -> Any:
        """Return `value` if it fits this parameter's type and constraint, else raise.

        An int is accepted for a float parameter (and stored as float); nothing else is
        converted here: coercion of model output lives in `construct_update_dict`.
        """
        label = self.name or "parameter"
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if _type_of_or_none(value) is not self.type:
            raise ParameterError(
                f"{label}: expected a {self.type.__name__}, got {type(value).__name__} {_short(value)}"
            )
        if self.type is float and not math.isfinite(value):
            raise ParameterError(f"{label}: {value!r} is not a finite number")
        problem = json_problem(value)
        if problem:
            raise ParameterError(f"{label}: {problem}; a parameter's value must survive a JSON round trip unchanged")
        if self.constraint is not None:
            problem = self.constraint.violation(value)
            if problem:
                raise ParameterError(f"{label}: {problem}")
        return value

    def __repr__(self) -> str:
        return f"Parameter(name={self.name!r}, value={_short(self.value)})"


def json_problem(value: Any, where: str = "the value", depth: int = 0) -> str | None:
    """Why `value` would not come back unchanged from JSON (None when it would).

    JSON holds str, int, finite float, bool, None, lists and dicts with str keys; a
    tuple, set, bytes, a non-str key, NaN or infinity, or a string with a lone surrogate
    (which UTF-8 cannot encode) would be changed or lost by a checkpoint.
    """
    if depth > 100:
        return f"{where} is nested more than 100 levels deep"
    if value is None or isinstance(value, (bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where} is {value!r}, not a finite number"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"{where} holds a lone surrogate, which cannot be written as UTF-8"
        return None
    if isinstance(value, list):
        for index, item in enumerate(value):
            problem = json_problem(item, f"item {index} of {where}", depth + 1)
            if problem:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"key {key!r} of {where} is a {type(key).__name__}; JSON keys are strings"
            problem = json_problem(item, f"{where}[{key!r}]", depth + 1)
            if problem:
                return problem
        return None
    return f"{where} is a {type(value).__name__}, which JSON cannot hold"


def _type_of_or_none(value: Any) -> type | None:
    try:
        return _type_of(value)
    except ParameterError:
        return None


def current_assignment() -> Mapping[Any, Any]:
    """The override map active in this task (empty outside any `assign`)."""
    return _OVERRIDES.get() or {}


def track_reads() -> Scope[set[str]]:
    """Collect the names of the parameters whose `.value` is read inside the block.

    Tasks and threads started inside add to the same set, so a rollout learns which
    parameters its agent used (a trainable parameter never read has no effect).
    """
    reads: set[str] = set()
    return Scope(reads, reads=reads)


#: Values keyed by `Parameter` objects, by names, or by both.
ParameterValues = Union[Mapping[Parameter, Any], Mapping[str, Any], Mapping[Union[Parameter, str], Any]]


@contextlib.contextmanager
def assign(values: ParameterValues) -> Iterator[None]:
    """Set parameter values for the current task only.

    Keys are `Parameter` objects or names (a name applies to every parameter of that
    name seen in this task; use `Agent.assign` to resolve names within one agent).
    Nested assignments merge, the inner one winning. Works in sync and async code;
    tasks and threads started inside inherit the values.
    """
    for key, value in values.items():
        if isinstance(key, Parameter):
            key.validate(value)
        elif not isinstance(key, str):
            raise OptoTypeError(f"assign() keys are Parameter objects or names, got {type(key).__name__}")
    merged = dict(current_assignment())
    names = {key for key in values if isinstance(key, str)}
    if names:
        # An inner assignment by name must beat an outer one by object for that name.
        merged = {k: v for k, v in merged.items() if not (isinstance(k, Parameter) and k.name in names)}
    merged.update(values)
    token = _OVERRIDES.set(merged)
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


class Demos(Parameter):
    """Few-shot demonstrations as a trainable parameter: a list of input/output pairs.

    The value is a list of `{"input": ..., "output": ...}` dicts (JSON values), at most
    `max_demos` of them. An agent shows them to its model as earlier turns of the
    conversation with `as_messages()`::

        self.demos = Demos(max_demos=4)
        ...
        messages = [system, *self.demos.as_messages(), {"role": "user", "content": question}]

    `DemoProposer` proposes demos from the training data; the aggregator merges demo
    proposals by rule (`opto.search.demo_rules.merge_demo_lists`), never through an LLM.
    """

    def __init__(
        self,
        demos: Any = (),
        *,
        max_demos: int = 4,
        name: str | None = None,
        description: str = "worked examples shown to the model before the input, as earlier conversation turns",
        trainable: bool = True,
        constraint: str | Constraint | Callable[[Any], bool] | None = None,
    ) -> None:
        if isinstance(max_demos, bool) or not isinstance(max_demos, int) or max_demos < 1:
            raise ParameterError(f"max_demos must be an int >= 1, got {max_demos!r}")
        self.max_demos = max_demos
        if isinstance(demos, (str, bytes, Mapping)) or not hasattr(demos, "__iter__"):
            raise ParameterError(
                "Demos takes a list of {'input': ..., 'output': ...} dicts (or nothing, for an empty list), "
                f"got {type(demos).__name__}"
            )
        super().__init__(
            [dict(d) if isinstance(d, Mapping) else d for d in demos],
            name=name,
            description=description,
            trainable=trainable,
            constraint=constraint,
        )

    def validate(self, value: Any) -> Any:
        """A list of at most `max_demos` dicts with exactly the keys "input" and "output"."""
        label = self.name or "demos"
        if isinstance(value, list):
            if len(value) > self.max_demos:
                raise ParameterError(f"{label}: {len(value)} demos, more than max_demos={self.max_demos}")
            for index, demo in enumerate(value):
                if not isinstance(demo, dict) or set(demo) != {"input", "output"}:
                    got = f"keys {sorted(demo)}" if isinstance(demo, dict) else f"a {type(demo).__name__}"
                    raise ParameterError(
                        f"{label}: demo {index} must be a dict with exactly the keys 'input' and 'output', got {got}"
                    )
        return super().validate(value)

    def as_messages(
        self, format_input: Callable[[Any], str] = str, format_output: Callable[[Any], str] = str
    ) -> list[dict[str, str]]:
        """The demos (as seen by the current task) as user/assistant chat turns."""
        messages: list[dict[str, str]] = []
        for demo in self.value:
            messages.append({"role": "user", "content": format_input(demo["input"])})
            messages.append({"role": "assistant", "content": format_output(demo["output"])})
        return messages
