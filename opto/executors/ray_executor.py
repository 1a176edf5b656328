"""`RayExecutor`: rollouts as Ray tasks (or on a pool of async Ray actors).

Ray's own retries are off: the driver decides what a lost worker means (`RemoteExecutor`),
so a rollout is retried a known number of times and recorded once.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import MissingDependencyError, OptoValueError
from .coordinator import Coordinator
from .remote import RemoteExecutor, WorkerError, WorkerLost
from .shipping import Shipment
from .worker import RolloutTask, aexecute, execute

__all__ = ["RayExecutor"]

logger = logging.getLogger(__name__)

_INSTALL = "RayExecutor needs Ray: pip install 'opto-agents[ray]'"


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise MissingDependencyError(_INSTALL) from exc
    return ray


class RayLink:
    """A `Link` to the run's coordinator actor."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def call(self, method: str, *args: Any) -> Any:
        import ray

        return ray.get(getattr(self.actor, method).remote(*args))

    async def acall(self, method: str, *args: Any) -> Any:
        return await getattr(self.actor, method).remote(*args)

    def send(self, method: str, *args: Any) -> None:
        getattr(self.actor, method).remote(*args)


def _lost_errors(ray: Any) -> tuple[type[BaseException], ...]:
    """Ray's errors that mean the process or node running a task is gone."""
    names = (
        "WorkerCrashedError",
        "NodeDiedError",
        "ActorDiedError",
        "ActorUnavailableError",
        "LocalRayletDiedError",
        "ObjectLostError",
        "OwnerDiedError",
        "ObjectReconstructionFailedError",
    )
    return tuple(getattr(ray.exceptions, name) for name in names if hasattr(ray.exceptions, name))


class _RayBackend:
    def __init__(
        self,
        *,
        num_cpus: float,
        resources: dict[str, float] | None,
        actors: int,
        actor_concurrency: int,
        address: str | None,
        runtime_env: dict[str, Any] | None,
    ) -> None:
        self.num_cpus = num_cpus
        self.resources = resources or {}
        self.actors = actors
        self.actor_concurrency = actor_concurrency
        self.address = address
        self.runtime_env = runtime_env
        self._task: Any = None
        self._pool: list[Any] = []
        self._busy: list[int] = []
        self._coordinator: Any = None
        self._handles: dict[Any, int] = {}  # actor task ref -> actor index

    def _ray(self) -> Any:
        ray = _import_ray()
        if not ray.is_initialized():
            logger.info("starting Ray (address=%s)", self.address or "a new local instance")
            ray.init(address=self.address, runtime_env=self.runtime_env, log_to_driver=False)
        return ray

    def capacity(self) -> int:
        if self.actors:
            return self.actors * self.actor_concurrency
        cpus = self._ray().cluster_resources().get("CPU", 1.0)
        return max(1, int(cpus / self.num_cpus)) if self.num_cpus > 0 else 64

    def link(self) -> RayLink:
        if self._coordinator is None:
            ray = self._ray()
            actor = ray.remote(num_cpus=0, max_restarts=0)(Coordinator)
            self._coordinator = actor.options(max_concurrency=1000).remote()
        return RayLink(self._coordinator)

    def put(self, shipment: Shipment) -> Any:
        return self._ray().put(shipment.blob)

    def submit(self, stored: Any, task: RolloutTask) -> Any:
        ray = self._ray()
        if not self.actors:
            if self._task is None:
                self._task = ray.remote(max_retries=0, retry_exceptions=False)(execute)
            return self._task.options(num_cpus=self.num_cpus, resources=self.resources).remote(stored, task)
        if not self._pool:
            actor = ray.remote(max_restarts=-1, max_task_retries=0)(_RolloutActor)
            self._pool = [
                actor.options(
                    num_cpus=self.num_cpus, resources=self.resources, max_concurrency=self.actor_concurrency
                ).remote()
                for _ in range(self.actors)
            ]
            self._busy = [0] * self.actors
        index = min(range(self.actors), key=self._busy.__getitem__)
        self._busy[index] += 1
        handle = self._pool[index].run.remote(stored, task)
        self._handles[handle] = index
        return handle

    async def result(self, handle: Any) -> dict[str, Any]:
        ray = self._ray()
        try:
            return await handle
        except _lost_errors(ray) as exc:
            raise WorkerLost(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
        except ray.exceptions.RayTaskError as exc:
            raise WorkerError(
                f"a Ray worker could not run the rollout: {exc.cause!r}. The agent's and guide's classes must be "
                "importable on every worker (install your package there, or pass runtime_env={'py_modules': "
                "[...]} / {'working_dir': ...}); classes defined in __main__ travel with the agent"
            ) from None
        finally:
            self._done(handle)

    def cancel(self, handle: Any) -> None:
        ray = self._ray()
        index = self._handles.get(handle)
        if index is None:
            ray.cancel(handle, force=True)  # a plain cancel does not stop a task inside asyncio.run
        else:
            # The actor's own timeout did not stop this rollout, so its loop is stuck:
            # restart the actor (its other rollouts are lost and submitted again).
            ray.kill(self._pool[index], no_restart=False)

    def close(self) -> None:
        if not self._ray_started():
            return
        import ray

        for actor in [*self._pool, *([self._coordinator] if self._coordinator is not None else [])]:
            ray.kill(actor, no_restart=True)
        self._pool, self._busy, self._coordinator = [], [], None

    @staticmethod
    def _ray_started() -> bool:
        import sys

        ray = sys.modules.get("ray")
        return ray is not None and ray.is_initialized()

    def _done(self, handle: Any) -> None:
        index = self._handles.pop(handle, None)
        if index is not None:
            self._busy[index] -= 1


class _RolloutActor:
    """A worker that runs many LLM-bound rollouts at once on one event loop."""

    async def run(self, blob: bytes, task: RolloutTask) -> dict[str, Any]:
        return await aexecute(blob, task)


class RayExecutor(RemoteExecutor):
    """A `RolloutExecutor` that runs each rollout as a Ray task (extra `ray`).

    Args:
        num_cpus: CPUs a rollout holds (fractions allowed: 0.25 packs 4 per core).
        resources: custom Ray resources a rollout holds, e.g. {"browser": 1}.
        actors: 0 runs one task per rollout; N > 0 runs rollouts on N async actors, each
            running up to `actor_concurrency` at once (for agents that mostly wait on an
            LLM: no process start per rollout). The agent must be async to share a loop.
        max_in_flight: rollouts submitted at once (default: what the cluster can run).
        max_attempts: tries of a rollout whose worker or node died.
        timeout: seconds per rollout before it is stopped and recorded as a timeout failure.
        grace: seconds past `timeout` before a rollout that its worker could not stop
            (sync code) is stopped by force: its worker process is killed.
        address: the cluster to join when Ray is not initialized yet ("auto": the one
            `ray start --head` started on this machine; None: a new local instance).
        runtime_env: Ray's runtime environment for the workers (`env_vars`, `py_modules`,
            `working_dir`), used when this executor initializes Ray.
    """

    def __init__(
        self,
        *,
        num_cpus: float = 1.0,
        resources: dict[str, float] | None = None,
        actors: int = 0,
        actor_concurrency: int = 16,
        max_in_flight: int | None = None,
        max_attempts: int = 3,
        timeout: float | None = None,
        grace: float = 2.0,
        address: str | None = None,
        runtime_env: dict[str, Any] | None = None,
    ) -> None:
        if num_cpus < 0:
            raise OptoValueError(f"num_cpus must be >= 0, got {num_cpus}")
        if actors < 0 or actor_concurrency < 1:
            raise OptoValueError(
                f"actors must be >= 0 and actor_concurrency >= 1, got {actors} and {actor_concurrency}"
            )
        _import_ray()  # fail now, not at the first rollout
        super().__init__(
            _RayBackend(
                num_cpus=num_cpus,
                resources=resources,
                actors=actors,
                actor_concurrency=actor_concurrency,
                address=address,
                runtime_env=runtime_env,
            ),
            max_in_flight=max_in_flight,
            max_attempts=max_attempts,
            timeout=timeout,
            grace=grace,
        )
