"""Benchmark: CPU-bound rollouts in one process (`AsyncioExecutor`) and on Ray (`RayExecutor`).

Each rollout burns a fixed CPU time in the agent (a sync busy loop, `--cpu` seconds,
measured as the thread's own CPU time) and makes one LLM call through `OpenAIModel` to a
`FakeOpenAIServer` in a child process. Reported per executor: rollouts per second, and
the speed-up over Ray with one worker CPU. Configurations:

- asyncio: every rollout in this process (sync agents run in threads, so the GIL
  makes one CPU the limit);
- ray, 1 CPU / 2 CPUs: `ray.init(num_cpus=N)` on this machine, one task per rollout;
- ray, 2-node cluster: `ray.cluster_utils.Cluster`, a head without CPUs and two nodes
  with one CPU each (processes on this machine, as a real cluster would place them);
- overhead: rollouts that do nothing, one in flight: the time per rollout on Ray minus
  in this process (scheduling, the result's trip back, usage and logs replayed), within
  one run and for runs of one rollout (which also ship the agent);
- rate limit: on Ray with 2 worker CPUs, one-call rollouts against a server allowing
  `--limit-rps` requests a second, the model's `requests_per_minute` set to the same
  and no patience for 429s (a refused request would fail its rollout).

    RAY_AUTH_MODE=disabled python bench/scale.py               # 40 rollouts of 0.2 s CPU
    RAY_AUTH_MODE=disabled python bench/scale.py --rollouts 80 --cpu 0.1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from typing import Any

import cloudpickle
from fake_server_process import fake_server

from opto import Agent, AsyncioExecutor, ExactMatchGuide, Example, Parameter
from opto.llm import OpenAIModel
from opto.testing import FakeOpenAIServer

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this script


class Burner(Agent):
    """Burns `cpu` seconds of its thread's CPU time, then asks the model once."""

    def __init__(self, model: OpenAIModel | None, cpu: float) -> None:
        self.model = model
        self.cpu = cpu
        self.prompt = Parameter("Answer.")

    async def forward(self, x: Any) -> str:
        if self.cpu:
            await asyncio.to_thread(burn, self.cpu)
        if self.model is None:
            return "ok"
        return (await self.model.complete([{"role": "user", "content": f"{self.prompt.value} {x}"}])).text


def burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    total = 0
    while time.thread_time() < end:
        total += sum(range(1000))


def data(n: int) -> list[Example]:
    return [Example(x=i, info="ok", id=f"r{i}") for i in range(n)]


def throughput(executor: Any, agent: Agent, n: int) -> tuple[float, int]:
    """(rollouts per second, failed rollouts) over one `run` of n rollouts."""
    started = time.perf_counter()
    rollouts = asyncio.run(executor.run(agent, ExactMatchGuide(), data(n)))
    return n / (time.perf_counter() - started), sum(r.failed for r in rollouts)


def per_rollout(executor: Any, agent: Agent, n: int) -> tuple[float, float]:
    """Seconds per rollout, one in flight: (within one run of n, median of n runs of one)."""
    started = time.perf_counter()
    asyncio.run(executor.run(agent, ExactMatchGuide(), data(n)))
    within = (time.perf_counter() - started) / n
    times = []
    for example in data(n):
        started = time.perf_counter()
        asyncio.run(executor.run(agent, ExactMatchGuide(), [example]))
        times.append(time.perf_counter() - started)
    return within, statistics.median(times)


def rate_limited(executor: Any, rps: int, n: int) -> dict[str, float]:
    """n one-call rollouts on `executor` against a server allowing `rps` requests a second,
    the model's limit set to the same: failed rollouts, 429s, requests per second."""
    with FakeOpenAIServer("ok", rate_limit_rps=rps) as server:
        model = OpenAIModel("fake-model", base_url=server.base_url, requests_per_minute=60 * rps,
                            rate_limit_patience=0, max_retries=0)  # a 429 would fail its rollout
        agent = Burner(model, 0.0)
        rate, failed = throughput(executor, agent, n)
        model.close()
        return {"failed": failed, "refused": server.rate_limited, "rate": rate,
                "ideal": n / ((n - rps / 2) / rps)}  # half a second's worth goes at once


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=40)
    parser.add_argument("--cpu", type=float, default=0.2, help="CPU seconds each rollout burns")
    parser.add_argument("--overhead-rollouts", type=int, default=50)
    parser.add_argument("--limit-rps", type=int, default=5, help="the rate-limited server's requests per second")
    parser.add_argument("--limit-rollouts", type=int, default=40)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.cluster_utils import Cluster

    from opto.executors import RayExecutor

    rows: list[tuple[str, float, int]] = []
    with fake_server("ok") as server:
        model = OpenAIModel("fake-model", base_url=server.base_url, max_retries=0)
        agent = Burner(model, args.cpu)
        idle = Burner(None, 0.0)
        rows.append(("asyncio (this process)", *throughput(AsyncioExecutor(), agent, args.rollouts)))
        in_process = per_rollout(AsyncioExecutor(concurrency=1), idle, args.overhead_rollouts)

        overhead = None
        limited: dict[str, float] = {}
        for cpus in (1, 2):
            ray.init(num_cpus=cpus, include_dashboard=False, object_store_memory=100 * 1024 * 1024,
                     log_to_driver=False)
            executor = RayExecutor()
            throughput(executor, agent, 4)  # warm: worker processes start
            rows.append((f"ray, {cpus} worker CPU{'s' if cpus > 1 else ''}", *throughput(executor, agent, args.rollouts)))
            if cpus == 1:
                one_at_a_time = RayExecutor(max_in_flight=1)
                overhead = per_rollout(one_at_a_time, idle, args.overhead_rollouts)
                one_at_a_time.close()
            else:
                limited = rate_limited(executor, args.limit_rps, args.limit_rollouts)
            executor.close()
            ray.shutdown()

        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": 80 * 1024 * 1024})
        for _ in range(2):
            cluster.add_node(num_cpus=1, object_store_memory=80 * 1024 * 1024)
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        executor = RayExecutor()
        throughput(executor, agent, 4)
        rows.append(("ray, 2-node cluster (1 CPU each)", *throughput(executor, agent, args.rollouts)))
        executor.close()
        ray.shutdown()
        cluster.shutdown()
        model.close()

    one_cpu = rows[1][1]
    print(f"{args.rollouts} rollouts of {args.cpu:g} s CPU + 1 LLM call; Ray {ray.__version__}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}, load {os.getloadavg()[0]:.2f}")
    print()
    print("| executor | rollouts/s | vs ray 1 CPU | failed |")
    print("|---|---:|---:|---:|")
    for name, rate, failed in rows:
        print(f"| {name} | {rate:.2f} | {rate / one_cpu:.2f}x | {failed} |")
    print()
    print()
    print(f"Rate limit across 2 worker processes: {args.limit_rollouts} one-call rollouts against a server allowing "
          f"{args.limit_rps} req/s, requests_per_minute={60 * args.limit_rps}: {limited['failed']} failed, "
          f"{limited['refused']} requests refused (429), {limited['rate']:.2f} rollouts/s "
          f"(ideal {limited['ideal']:.2f})")
    assert overhead is not None
    print("Overhead per rollout on Ray, one in flight, an agent that does nothing (Ray minus this process):")
    print(f"- within a run of {args.overhead_rollouts}: {(overhead[0] - in_process[0]) * 1000:.1f} ms "
          f"({overhead[0] * 1000:.1f} ms on Ray, {in_process[0] * 1000:.2f} ms in this process)")
    print(f"- a run of one rollout (the agent shipped each time), median of {args.overhead_rollouts}: "
          f"{(overhead[1] - in_process[1]) * 1000:.1f} ms ({overhead[1] * 1000:.1f} ms on Ray, "
          f"{in_process[1] * 1000:.2f} ms in this process)")


if __name__ == "__main__":
    main()
