"""Checks of `train()`'s options, made before anything runs: each names the option and the value."""

from __future__ import annotations

import numbers
from typing import Any

from ..errors import OptoTypeError, OptoValueError

__all__ = ["check_flag", "check_int", "check_number"]


def check_int(name: str, value: Any, *, minimum: int, none_ok: bool = False) -> None:
    """An int >= `minimum` (a bool or a string such as '4' is refused, not converted)."""
    if value is None and none_ok:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise OptoTypeError(
            f"{name} must be an int >= {minimum}{' or None' if none_ok else ''}, got {value!r} ({type(value).__name__})"
        )
    if value < minimum:
        raise OptoValueError(f"{name} must be >= {minimum}{' or None' if none_ok else ''}, got {value!r}")


def check_number(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    none_ok: bool = False,
    open_low: bool = False,
) -> None:
    """A real number within [low, high] ((low, high] with `open_low`)."""
    if value is None and none_ok:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != value:  # NaN: value != value
        raise OptoTypeError(
            f"{name} must be a number{' or None' if none_ok else ''}, got {value!r} ({type(value).__name__})"
        )
    value = float(value)
    below = low is not None and (value <= low if open_low else value < low)
    if below or (high is not None and value > high):
        left = "(" if open_low else "["
        span = f"within {left}{low if low is not None else '-inf'}, {high if high is not None else 'inf'}]"
        raise OptoValueError(f"{name} must be {span}, got {value!r}")


def check_flag(name: str, value: Any) -> None:
    """True or False (a string such as 'false' would be truthy)."""
    if not isinstance(value, bool):
        raise OptoTypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
