"""Evaluation at scale: opto's client against the bare HTTP client, and evaluate on Ray.

Part 1, one run against `FakeOpenAIServer` in its own process (answering every request
after `--latency` seconds): N one-call rollouts at concurrency 64 and 256, through

- aiohttp directly (post the JSON, read the JSON): the floor, what any client must spend;
- the OpenAI SDK (`AsyncOpenAI`, retries off);
- `opto.evaluate` of an agent that makes one `OpenAIModel` call per example (its trace,
  usage, budget checks, rollout records and all);

all three sending the same request for each example (the agent's system prompt and the
input, with the key in an Authorization header).

Each row gives the wall time, this process's CPU time per call (all threads) and both as a
ratio to the floor's. The clients run in rounds (one run of each, a full garbage
collection before every run); a ratio is taken within its round, since the machine's speed
drifts between rounds, and the median over `--repeat` rounds is shown with each round's
CPU ratio and the full collections that fell inside the measured runs.

Part 2: `opto.evaluate` with `RayExecutor` on CPU-bound rollouts (each burns `--cpu`
seconds of CPU, then makes one model call), with 1 and then 2 worker CPUs.

    python bench/evaluate.py                       # about a minute
    python bench/evaluate.py --calls 4000 --concurrency 64 256 --ray-rollouts 24
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import openai
from fake_server_process import fake_server

from opto import Agent, ExactMatchGuide, OpenAIModel, Parameter, aevaluate, evaluate

SYSTEM_PROMPT = "Answer."
API_KEY = "bench"


def _messages(system: str, x: Any) -> list[dict[str, str]]:
    """What every client sends for example `x`: the agent's system prompt and the input."""
    return [{"role": "system", "content": system}, {"role": "user", "content": str(x)}]


def _cpu() -> float:
    return time.process_time()  # every thread of this process


async def _aiohttp_calls(base_url: str, calls: int, concurrency: int) -> None:
    gate = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    headers = {"Authorization": f"Bearer {API_KEY}"}  # the same request as the others: a key is a must
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def one(x: int) -> None:
            body = {"model": "bench-model", "messages": _messages(SYSTEM_PROMPT, x)}
            async with gate, session.post(f"{base_url}/chat/completions", json=body) as response:
                reply = await response.json()
                assert reply["choices"][0]["message"]["content"]

        await asyncio.gather(*(one(x) for x in range(calls)))


async def _sdk_calls(base_url: str, calls: int, concurrency: int) -> None:
    gate = asyncio.Semaphore(concurrency)
    client = openai.AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=0)

    async def one(x: int) -> None:
        async with gate:
            reply = await client.chat.completions.create(
                model="bench-model",
                messages=_messages(SYSTEM_PROMPT, x),  # type: ignore[arg-type]  # plain dicts
            )
            assert reply.choices[0].message.content

    await asyncio.gather(*(one(x) for x in range(calls)))
    await client.close()


class OneCall(Agent):
    """One model call per example: the cheapest agent, so what is measured is opto."""

    def __init__(self, model: Any, cpu_seconds: float = 0.0) -> None:
        self.model = model
        self.cpu_seconds = cpu_seconds
        self.prompt = Parameter(SYSTEM_PROMPT, description="system prompt")

    async def forward(self, x: Any) -> str:
        if self.cpu_seconds:  # the agent's own work (parsing, tools): CPU-bound, holds the GIL
            started = time.process_time()
            while time.process_time() - started < self.cpu_seconds:
                pass
        return (await self.model.complete(_messages(self.prompt.value, x))).text


def _data(n: int) -> list[dict[str, Any]]:
    return [{"x": i, "info": "echo", "id": f"e{i}"} for i in range(n)]


KINDS = ("aiohttp", "sdk", "opto")  # the floor first: the others are measured against it


def client_runs(kind: str, base_url: str, concurrency: int) -> tuple[Callable[[int], Any], OpenAIModel | None]:
    """A function making `n` calls through client `kind`, each batch in its own event loop,
    and the model to close when done (opto's; None for the others)."""
    if kind == "aiohttp":
        return lambda n: asyncio.run(_aiohttp_calls(base_url, n, concurrency)), None
    if kind == "sdk":
        return lambda n: asyncio.run(_sdk_calls(base_url, n, concurrency)), None
    model = OpenAIModel("bench-model", base_url=base_url, api_key=API_KEY, max_concurrency=concurrency)
    agent = OneCall(model)
    return lambda n: asyncio.run(
        aevaluate(agent, ExactMatchGuide(), _data(n), concurrency=concurrency, max_failures=None)
    ), model


def measure(kind: str, base_url: str, calls: int, concurrency: int) -> dict[str, float]:
    """Wall time and CPU of `calls` calls (after a warm-up of `concurrency` calls, and a
    full garbage collection, so no run pays for the garbage of the one before)."""
    run, model = client_runs(kind, base_url, concurrency)
    run(concurrency)  # warm-up: lazy imports done
    gc.collect()
    full_before = gc.get_stats()[2]["collections"]
    cpu, wall = _cpu(), time.perf_counter()
    run(calls)
    wall, cpu = time.perf_counter() - wall, _cpu() - cpu
    full = gc.get_stats()[2]["collections"] - full_before
    if model is not None:
        model.close()
    return {"wall": wall, "cpu_ms": cpu / calls * 1000, "full_gc": full}


def part_one(calls: int, concurrencies: list[int], latency: float, repeat: int) -> list[dict[str, Any]]:
    """Rounds of one run per client; each ratio to the floor is taken within a round (the
    machine's speed drifts between rounds) and the median round is shown."""
    rows = []
    with fake_server(True) as server:
        server.set_latency(latency)
        for concurrency in concurrencies:
            ideal = -(-calls // concurrency) * latency
            rounds = [{kind: measure(kind, server.base_url, calls, concurrency) for kind in KINDS} for _ in range(repeat)]
            for kind in KINDS:
                found = {
                    "cpu_ms": _median(r[kind]["cpu_ms"] for r in rounds),
                    "wall": _median(r[kind]["wall"] for r in rounds),
                    "cpu_x": _median(r[kind]["cpu_ms"] / r["aiohttp"]["cpu_ms"] for r in rounds),
                    "wall_x": _median(r[kind]["wall"] / r["aiohttp"]["wall"] for r in rounds),
                    "cpu_x_range": [r[kind]["cpu_ms"] / r["aiohttp"]["cpu_ms"] for r in rounds],
                    "full_gc": sum(r[kind]["full_gc"] for r in rounds),
                }
                rows.append({"concurrency": concurrency, "client": kind, "ideal": ideal, **found})
    return rows


def _median(values: Any) -> float:
    return statistics.median(list(values))


def part_two(rollouts: int, cpu_seconds: float) -> list[dict[str, Any]]:
    import ray

    from opto.executors import RayExecutor

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    rows = []
    with fake_server(True) as server:
        # Keys never travel with a shipped agent: the workers read theirs from the environment.
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"OPENAI_API_KEY": "bench"}})  # fmt: skip
        try:
            for workers in (1, 2):
                # num_cpus per rollout sets how many run at once on the 2-CPU instance
                executor = RayExecutor(num_cpus=2 / workers)
                model = OpenAIModel("bench-model", base_url=server.base_url, api_key="bench")
                agent = OneCall(model, cpu_seconds)
                evaluate(agent, ExactMatchGuide(), _data(workers * 2), executor=executor, max_failures=None)  # warm-up
                started = time.perf_counter()
                result = evaluate(agent, ExactMatchGuide(), _data(rollouts), executor=executor, max_failures=None)
                if result.n_failed:
                    raise RuntimeError(f"{result.n_failed} rollouts failed on Ray: the timing would be meaningless")
                rows.append({"workers": workers, "wall": time.perf_counter() - started, "n": result.n})
                executor.close()
                model.close()
        finally:
            ray.shutdown()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--latency", type=float, default=0.05, help="seconds the server takes per request")
    parser.add_argument("--repeat", type=int, default=5, help="rounds (one run of each client); medians are shown")
    parser.add_argument("--ray-rollouts", type=int, default=16, help="rollouts of part 2 (0: skip it)")
    parser.add_argument("--cpu", type=float, default=0.25, help="CPU seconds per rollout in part 2")
    args = parser.parse_args(argv)
    load = os.getloadavg()
    print(f"{platform.machine()} {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, aiohttp {aiohttp.__version__}, "
          f"openai {openai.__version__}; load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")  # fmt: skip
    print(f"\nPart 1: {args.calls} one-call rollouts, server latency {args.latency * 1000:.0f} ms (own process)")
    print("| concurrency | client | wall s | ideal s | wall / floor | CPU ms per call | CPU / floor | each round | full GCs |")
    print("|---:|---|---:|---:|---:|---:|---:|---|---:|")
    for row in part_one(args.calls, args.concurrency, args.latency, args.repeat):
        each = " ".join(f"{x:.2f}" for x in row["cpu_x_range"])
        print(f"| {row['concurrency']} | {row['client']} | {row['wall']:.2f} | {row['ideal']:.2f} | "
              f"{row['wall_x']:.2f}x | {row['cpu_ms']:.3f} | {row['cpu_x']:.2f}x | {each} | {row['full_gc']} |")  # fmt: skip
    if args.ray_rollouts:
        print(f"\nPart 2: evaluate on Ray, {args.ray_rollouts} rollouts of {args.cpu:g} s CPU + 1 call")
        print("| worker CPUs | wall s | speed-up |")
        print("|---:|---:|---:|")
        rows = part_two(args.ray_rollouts, args.cpu)
        for row in rows:
            print(f"| {row['workers']} | {row['wall']:.2f} | {rows[0]['wall'] / row['wall']:.2f}x |")
    load = os.getloadavg()
    print(f"\nload average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
