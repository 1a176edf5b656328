"""Sending an agent and its guide to other processes: pickling with clear errors.

The agent and guide go as one cloudpickle blob per `run` call (their stored values
may have changed since the last). Classes defined in `__main__` travel by value;
others by reference, so their modules must be importable on every worker. Parameter
values of a run travel by name, because a `Parameter` unpickled apart from its agent
is another object.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from ..core.agent import Agent
from ..core.guides import Guide
from ..core.parameters import Parameter, ParameterValues, current_assignment
from ..errors import MissingDependencyError, OptoError, OptoValueError
from ..llm.shared_limits import LimitsHub, shipping_to

__all__ = ["ShippingError", "Shipment", "ship", "values_by_name"]

_MAX_DEPTH = 12


class ShippingError(OptoError, TypeError):
    """The agent or guide cannot be sent to worker processes (something in it does not pickle)."""


class Shipment:
    """A pickled (agent, guide, run budgets) and its digest, which workers use to load it only once."""

    def __init__(self, blob: bytes) -> None:
        self.blob = blob
        self.digest = hashlib.sha256(blob).hexdigest()[:16]


def _cloudpickle() -> Any:
    try:
        import cloudpickle
    except ImportError as exc:  # pragma: no cover - installed with the ray extra
        raise MissingDependencyError(
            "sending agents to other processes needs cloudpickle: pip install 'opto-agents[ray]'"
        ) from exc
    return cloudpickle


def ship(agent: Agent, guide: Guide, hub: LimitsHub | None = None, budgets: tuple[Any, ...] = ()) -> Shipment:
    """Pickle agent, guide and the run's budgets (`budget_scope`); budgets and rate
    limiters inside are attached to `hub`.

    Raises `ShippingError` naming the attribute that does not pickle (e.g.
    `agent.client._lock`), before anything is sent.
    """
    cloudpickle = _cloudpickle()
    try:
        if hub is None:
            return Shipment(cloudpickle.dumps((agent, guide, budgets)))
        with shipping_to(hub):
            return Shipment(cloudpickle.dumps((agent, guide, budgets)))
    except Exception as exc:
        for root, name in ((agent, "agent"), (guide, "guide")):
            path, found, problem = find_unpicklable(root, name, cloudpickle)
            if path is not None:
                kind = f"{type(found).__module__}.{type(found).__qualname__}"
                raise ShippingError(
                    f"cannot send the {name} to worker processes: {path} (a {kind}) cannot be "
                    f"pickled: {problem}. Make it picklable (a __getstate__ that drops it and a __setstate__ "
                    "that rebuilds it), or create it on first use inside the agent (as opto's models do with "
                    "their connections)"
                ) from exc
        raise ShippingError(f"cannot send the agent and guide to worker processes: {exc}") from exc


def find_unpicklable(obj: Any, path: str, cloudpickle: Any, depth: int = 0) -> tuple[str | None, Any, str]:
    """The deepest attribute path under `obj` that fails to pickle, the object there and
    why (path None: everything pickles)."""
    try:
        cloudpickle.dumps(obj)
        return None, None, ""
    except Exception as exc:
        problem = f"{type(exc).__name__}: {exc}"
    if depth < _MAX_DEPTH:
        for child_path, child in _children(obj, path):
            found = find_unpicklable(child, child_path, cloudpickle, depth + 1)
            if found[0] is not None:
                return found
    return path, obj, problem


def _children(obj: Any, path: str) -> list[tuple[str, Any]]:
    if isinstance(obj, Mapping):
        return [(f"{path}[{key!r}]", value) for key, value in obj.items()]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [(f"{path}[{i}]", value) for i, value in enumerate(obj)]
    state = getattr(obj, "__dict__", None)
    if isinstance(state, dict):
        return [(f"{path}.{name}", value) for name, value in state.items()]
    return []


def values_by_name(values: ParameterValues | None) -> dict[str, Any]:
    """The values a rollout runs under (the caller's own assignment included), keyed by name."""
    merged: dict[str, Any] = {}
    for source in (current_assignment(), values or {}):
        for key, value in source.items():
            name = key.name if isinstance(key, Parameter) else key
            if name is None:
                raise OptoValueError(
                    "a Parameter without a name cannot be sent to a worker; call agent.parameters() first"
                )
            merged[name] = value
    return merged
