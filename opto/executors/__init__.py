"""Where rollouts run besides this process: `RayExecutor`, and the machinery it shares.

`RayExecutor` imports Ray only when it is made (extra `ray`). `RemoteExecutor` runs on
any `Backend`; `opto.testing.FakeCluster` is one in this process, for tests.
"""

from __future__ import annotations

from typing import Any

from .remote import Backend, RemoteExecutor, WorkerError, WorkerLost
from .shipping import ShippingError

__all__ = ["Backend", "RayExecutor", "RemoteExecutor", "ShippingError", "WorkerError", "WorkerLost"]


def __getattr__(name: str) -> Any:
    if name == "RayExecutor":
        from .ray_executor import RayExecutor

        return RayExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
