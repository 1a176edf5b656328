"""Which parameters a step proposes for: all of them, or one at a time.

With several text parameters, proposals that change all of them at once tend to undo
each other's gains; GEPA's answer is to rewrite one component a step. A
`ComponentSelector` picks the names a step may change; the proposers then see the others
as fixed (shown as context, never proposed).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ..core.parameters import Parameter

__all__ = ["AllComponents", "ComponentSelector", "RoundRobin", "focused"]


@runtime_checkable
class ComponentSelector(Protocol):
    """Picks the trainable parameters (by name) a step proposes for."""

    name: str

    def select(self, names: Sequence[str], step: int) -> list[str]:
        """A non-empty subset of `names` (the trainable parameters, in the agent's order)."""
        ...


class AllComponents:
    """Every trainable parameter, every step."""

    name = "all"

    def select(self, names: Sequence[str], step: int) -> list[str]:
        return list(names)


class RoundRobin:
    """One trainable parameter a step, in turn (step 1 the first, step 2 the second, ...)."""

    name = "round_robin"

    def select(self, names: Sequence[str], step: int) -> list[str]:
        return [names[(step - 1) % len(names)]] if names else []


def focused(parameters: Sequence[Parameter], names: Sequence[str]) -> list[Parameter]:
    """The parameters as a proposer should see them: those not in `names` as fixed copies
    (the agent's own parameters are not touched)."""
    chosen = set(names)
    shown = []
    for param in parameters:
        if param.trainable and param.name not in chosen:
            param = copy.copy(param)
            param.trainable = False
        shown.append(param)
    return shown
