"""Sampling overrides for a block of code: `with sampling(temperature=1.0, seed=3): ...`.

An agent usually fixes its own temperature (often 0, to be repeatable). To gather several
different rollouts of one example (RL data, `opto.collect`), every model call made inside
the block, in this task and the tasks and threads it starts, uses the block's temperature
and seed instead of the ones the agent passed. The seed is part of the request, so the
response cache keeps the samples apart.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from pydantic import BaseModel

from ..errors import OptoValueError

__all__ = ["Sampling", "current_sampling", "sampling"]


class Sampling(BaseModel):
    """What the calls inside a `sampling` block use (None: the call's own setting)."""

    temperature: float | None = None
    seed: int | None = None


_CURRENT: contextvars.ContextVar[Sampling | None] = contextvars.ContextVar("opto_sampling", default=None)


@contextlib.contextmanager
def sampling(*, temperature: float | None = None, seed: int | None = None) -> Iterator[Sampling]:
    """Override the temperature and seed of every model call made inside the block."""
    if temperature is not None and not 0.0 <= temperature <= 2.0:
        raise OptoValueError(f"temperature must be within [0, 2], got {temperature}")
    token = _CURRENT.set(Sampling(temperature=temperature, seed=seed))
    try:
        yield _CURRENT.get()  # type: ignore[misc]
    finally:
        _CURRENT.reset(token)


def current_sampling() -> Sampling | None:
    """The innermost `sampling` block's settings, or None outside any."""
    return _CURRENT.get()
