"""Where rollouts run: the `RolloutExecutor` protocol and its implementations.

`AsyncioExecutor` (the default) runs them as asyncio tasks in this process;
`RemoteExecutor` on any `Backend` of worker processes (`opto.testing.FakeCluster` is one
in this process, for tests); `RayExecutor` on a Ray cluster, importing Ray only when it
is made (extra `ray`). A new executor implements `RolloutExecutor` (`local.py`).
"""

from __future__ import annotations

from typing import Any

from .local import AsyncioExecutor, RolloutExecutor
from .remote import Backend, RemoteExecutor, WorkerError, WorkerLost
from .shipping import ShippingError

__all__ = [
    "AsyncioExecutor",
    "Backend",
    "RayExecutor",
    "RemoteExecutor",
    "RolloutExecutor",
    "ShippingError",
    "WorkerError",
    "WorkerLost",
]


def __getattr__(name: str) -> Any:
    if name == "RayExecutor":
        from .ray_executor import RayExecutor

        return RayExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
