"""How every search option is given: a name from a short list, or an object of its protocol."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ..errors import OptoValueError

T = TypeVar("T")


def choose(option: str, spec: Any, protocol: type[T], choices: Mapping[str, Callable[[], T]]) -> T:
    """`spec` itself when it follows `protocol`, else the object its name makes."""
    if isinstance(spec, protocol):
        return spec
    if not isinstance(spec, str) or spec not in choices:
        raise OptoValueError(f"{option} must be one of {sorted(choices)} or a {protocol.__name__}, got {spec!r}")
    return choices[spec]()
