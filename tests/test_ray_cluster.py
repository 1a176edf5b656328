"""`RayExecutor` on a two-node `ray.cluster_utils.Cluster`: a node dies mid-rollout and the
rollout runs again on the other node, recorded once."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from opto import Agent, ExactMatchGuide, Example, Parameter

ray = pytest.importorskip("ray", reason="the `ray` extra is part of the test install")
from ray.cluster_utils import Cluster  # noqa: E402

from opto.executors import RayExecutor  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.xdist_group("ray")]  # one Ray instance on the machine at a time

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        ray.shutdown()
    # A node is declared dead after 3 missed health checks, 0.5 s apart (not the default 15 s).
    system = {"health_check_period_ms": 500, "health_check_failure_threshold": 3}
    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": 80 * 1024 * 1024,
                                                         "_system_config": system})
    nodes = [made.add_node(num_cpus=1, object_store_memory=80 * 1024 * 1024) for _ in range(2)]
    ray.init(address=made.address, log_to_driver=False)
    made.wait_for_nodes()
    yield made, nodes
    ray.shutdown()
    made.shutdown()  # this cluster's processes only: never `ray stop`


class OnNode(Agent):
    """Writes the id of the node it runs on, then takes long on its first attempt at "slow"."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.p = Parameter("x")

    def forward(self, x: Any) -> str:
        node = ray.get_runtime_context().get_node_id()
        first = Path(self.folder, f"{x}.first")
        if x == "slow" and not first.exists():
            first.with_suffix(".tmp").write_text(node)
            first.with_suffix(".tmp").rename(first)  # whole, for the test thread that reads it
            time.sleep(60)
        Path(self.folder, f"{x}.{node}").touch()
        return "done"


def test_a_node_that_dies_mid_rollout_is_replaced_by_the_other_node(cluster, tmp_path, caplog):
    made, nodes = cluster
    executor = RayExecutor(num_cpus=1)
    data = [Example(x="slow", info="done", id="slow"), Example(x="quick", info="done", id="quick")]
    first = tmp_path / "slow.first"

    def kill_the_slow_node() -> None:
        deadline = time.monotonic() + 60
        while not first.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        node_id = first.read_text()
        made.remove_node(next(node for node in nodes if node.node_id == node_id))

    killer = threading.Thread(target=kill_the_slow_node)
    killer.start()
    seen: list[str] = []
    with caplog.at_level(logging.WARNING, logger="opto.executors"):
        got = asyncio.run(executor.run(OnNode(str(tmp_path)), ExactMatchGuide(), data,
                                       on_result=lambda r: seen.append(r.example_id)))
    killer.join()
    assert [r.output for r in got] == ["done", "done"] and not any(r.failed for r in got)
    assert sorted(seen) == ["quick", "slow"]
    dead = first.read_text()
    finished_on = [p.suffix[1:] for p in tmp_path.glob("slow.*") if p.suffix != ".first"]
    assert len(finished_on) == 1 and finished_on[0] != dead
    lost = [r.getMessage() for r in caplog.records if "lost its worker" in r.getMessage()]
    assert len(lost) == 1 and "slow" in lost[0]
