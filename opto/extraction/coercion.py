"""Turning a suggested value into a parameter's value: coercion, validation, the update.

`construct_update(parameters, suggestion)` converts each suggested value to its
parameter's type (`"False"` to False, `"[3, 4]"` to a list, `"4.0"` to 4), validates it
with `Parameter.validate`, and reports what it had to skip and why;
`construct_update_dict` returns only the update, or raises on the first problem.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.parameters import Parameter, _short
from ..errors import OptoError, OptoValueError

__all__ = ["SkippedValue", "UpdateError", "UpdateResult", "construct_update", "construct_update_dict"]

logger = logging.getLogger("opto.extraction")


@dataclass(frozen=True)
class SkippedValue:
    """A suggested value that did not make it into the update, and why."""

    name: str
    value: Any
    reason: str

    def describe(self) -> str:
        return f"{self.name!r} = {_short(self.value)}: {self.reason}"


class UpdateError(OptoError, ValueError):
    """A suggested value cannot be applied (unknown name, not trainable, bad type or constraint)."""

    def __init__(self, skipped: Iterable[SkippedValue]) -> None:
        self.skipped = list(skipped)
        first = self.skipped[0]
        more = f" (and {len(self.skipped) - 1} more)" if len(self.skipped) > 1 else ""
        super().__init__(f"cannot update parameter {first.describe()}{more}")
        self.name, self.value, self.reason = first.name, first.value, first.reason


# -------------------------------------------------------------------- coercion


_TRUE_WORDS = frozenset({"true", "yes", "1"})
_FALSE_WORDS = frozenset({"false", "no", "0"})


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
    raise OptoValueError(f"cannot read {_short(value)} as a bool")


def _to_int(value: Any) -> int:
    number = value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            try:
                number = float(value.strip())
            except ValueError:
                raise OptoValueError(f"cannot read {_short(value)} as an int") from None
    if isinstance(number, bool):
        raise OptoValueError(f"{value!r} is a bool, not an int")
    if isinstance(number, int):
        return number
    if isinstance(number, float):
        if math.isfinite(number) and number.is_integer():
            return int(number)
        raise OptoValueError(f"{_short(value)} is not a whole number")
    raise OptoValueError(f"cannot read {_short(value)} as an int")


def _to_float(value: Any) -> float:
    if isinstance(value, bool):
        raise OptoValueError(f"{value!r} is a bool, not a number")
    try:
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            return float(value.strip())
    except (ValueError, OverflowError):
        pass
    raise OptoValueError(f"cannot read {_short(value)} as a number")


def _to_str(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return json.dumps(value, ensure_ascii=False, default=str)


def _to_container(kind: type) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if isinstance(value, str):
            value = _parse_text(value.strip())
        if kind is list and isinstance(value, tuple):
            value = list(value)
        if isinstance(value, kind):
            return value
        raise OptoValueError(f"cannot read {_short(value)} as a {kind.__name__}")

    return convert


def _parse_text(text: str) -> Any:
    """A string holding JSON or a Python literal, parsed (a sentinel when it holds neither)."""
    # Imported here, not at the top: the extraction package imports this module.
    from .loose_json import parse_exact

    return parse_exact(text)


_COERCIONS: dict[type, Callable[[Any], Any]] = {
    bool: _to_bool,
    int: _to_int,
    float: _to_float,
    str: _to_str,
    list: _to_container(list),
    dict: _to_container(dict),
}


def _coerce(param: Parameter, value: Any) -> Any:
    """`value` converted to the parameter's type and validated; ValueError says why not."""
    if value is None:
        raise OptoValueError("no value (None)")
    return param.validate(_COERCIONS[param.type](value))


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (so True is not 1)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


# ---------------------------------------------------------------- public: update


@dataclass
class UpdateResult:
    """The checked update (name -> value) and the suggested values left out of it."""

    update: dict[str, Any] = field(default_factory=dict)
    skipped: list[SkippedValue] = field(default_factory=list)


def _by_name(parameters: Mapping[str, Parameter] | Iterable[Parameter]) -> dict[str, Parameter]:
    if isinstance(parameters, Mapping):
        return {str(name): param for name, param in parameters.items()}
    named: dict[str, Parameter] = {}
    for param in parameters:
        if param.name is None:
            raise OptoValueError(f"{param!r} has no name; pass a mapping of name -> Parameter")
        if named.get(param.name, param) is not param:
            raise OptoValueError(f"two parameters are named {param.name!r}")
        named[param.name] = param
    return named


def _check(parameters: Mapping[str, Parameter] | Iterable[Parameter], suggestion: Mapping[str, Any]) -> UpdateResult:
    named = _by_name(parameters)
    result = UpdateResult()
    for name, value in suggestion.items():
        param = named.get(name)
        if param is None:
            reason = "not a parameter name"
        elif not param.trainable:
            reason = "the parameter is not trainable"
        else:
            try:
                accepted = _coerce(param, value)
            except ValueError as exc:  # ParameterError is a ValueError
                reason = str(exc)
            else:
                if not _same(accepted, param.stored_value):
                    result.update[name] = accepted
                continue
        result.skipped.append(SkippedValue(str(name), value, reason))
    return result


def construct_update(
    parameters: Mapping[str, Parameter] | Iterable[Parameter], suggestion: Mapping[str, Any]
) -> UpdateResult:
    """Check a suggestion against the parameters; each skipped value is logged as a warning.

    `parameters` is a mapping name -> Parameter, or Parameters that all have names. Each
    suggested value is converted to its parameter's type, then `Parameter.validate`d:

    - bool: a bool; 0 or 1; "true"/"false"/"yes"/"no"/"1"/"0" in any case.
    - int: an int; a float or numeric string only when whole ("4.0" -> 4; 4.5 is refused).
    - float: an int or float; a numeric string.
    - str: a str as is; a number as ``str(number)``; anything else (bool, list, dict)
      as JSON text, e.g. ``["a", "b"]`` -> ``'["a", "b"]'``.
    - list / dict: a list / dict, or a string holding one as JSON or a Python literal.

    Skipped, with the reason: names that are not parameters, parameters that are not
    trainable, None, values that cannot be converted, values that fail validation.
    Values equal to the parameter's stored value are left out silently (a no-op).
    """
    result = _check(parameters, suggestion)
    for item in result.skipped:
        logger.warning("skipped suggested value %s", item.describe())
    return result


def construct_update_dict(
    parameters: Mapping[str, Parameter] | Iterable[Parameter],
    suggestion: Mapping[str, Any],
    ignore_extraction_error: bool = True,
) -> dict[str, Any]:
    """The checked update, name -> value, as `construct_update` builds it.

    With `ignore_extraction_error` False, any value that would be skipped raises
    `UpdateError` naming the parameter, the value and the reason instead.
    """
    if ignore_extraction_error:
        return construct_update(parameters, suggestion).update
    result = _check(parameters, suggestion)
    if result.skipped:
        raise UpdateError(result.skipped)
    return result.update
