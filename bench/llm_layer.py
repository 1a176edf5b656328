"""Benchmark of the model layer's concurrency: OpenAIModel against the offline fake server.

64 chat calls go through `OpenAIModel` to `FakeOpenAIServer` (200 ms latency per request)
at several `max_concurrency` settings. With perfect concurrency the wall time is
ceil(64 / c) x 0.2 s; the overhead column is how far the model layer (private event
loop, semaphore, openai client, connection pool) and the fake server are from that.

    python bench/llm_layer.py
    python bench/llm_layer.py --calls 128 --latency 0.1 --concurrency 1 16 --repeat 5
    python bench/llm_layer.py --server-in-process   # the fake server in this process

By default the fake server runs in a child process, as a real server would: measured in
this process, its handler threads share the GIL with the client and their CPU is
counted against the model layer.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import sys
import time

from fake_server_process import fake_server

from opto.llm import OpenAIModel

MESSAGES = [{"role": "user", "content": "How many objects are in the box?"}]


async def _run_calls(model: OpenAIModel, calls: int) -> None:
    completions = await asyncio.gather(*(model.complete(MESSAGES) for _ in range(calls)))
    assert all(c.text for c in completions)


def measure(concurrency: int, calls: int, latency: float, separate_process: bool = False) -> dict[str, float]:
    """Wall time of `calls` calls at `max_concurrency=concurrency`, with a fresh server and model."""
    with fake_server(separate_process) as server:
        model = OpenAIModel("bench-model", base_url=server.base_url, api_key="bench", max_concurrency=concurrency)
        try:
            # Warm-up outside the timed part, at no latency: starts the private loop and the
            # client and opens `concurrency` keep-alive connections, so what is timed is the
            # steady state of the layer, not TCP handshakes.
            asyncio.run(_run_calls(model, concurrency))
            server.set_latency(latency)
            start = time.perf_counter()
            asyncio.run(_run_calls(model, calls))
            wall = time.perf_counter() - start
        finally:
            model.close()
        peak, total = server.stats()
        received = total - concurrency
    if received != calls:
        raise RuntimeError(f"the server received {received} requests, expected {calls}")
    ideal = math.ceil(calls / concurrency) * latency
    return {
        "concurrency": concurrency,
        "wall": wall,
        "ideal": ideal,
        "overhead": (wall / ideal - 1) * 100,
        "peak": peak,
    }


def measure_median(
    concurrency: int, calls: int, latency: float, repeat: int, separate_process: bool = False
) -> dict[str, float]:
    """The run with the median wall time out of `repeat`."""
    runs = [measure(concurrency, calls, latency, separate_process) for _ in range(repeat)]
    runs.sort(key=lambda row: row["wall"])
    return runs[len(runs) // 2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per request at the server")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 16, 64])
    parser.add_argument("--repeat", type=int, default=1, help="runs per setting; the median is shown")
    parser.add_argument("--server-in-process", action="store_true",
                        help="run the fake server in this process (its threads then share the GIL with the client)")
    args = parser.parse_args(argv)
    server_process = not args.server_in_process

    where = "a child process" if server_process else "this process"
    print(
        f"{args.calls} calls, {args.latency * 1000:.0f} ms server latency, server in {where}, "
        f"median of {args.repeat}; "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    header = (
        f"{'concurrency':>11} | {'wall (s)':>8} | {'ideal (s)':>9} | {'overhead':>8} | {'server peak in flight':>21}"
    )
    print(header)
    print("-" * len(header))
    for concurrency in args.concurrency:
        row = measure_median(concurrency, args.calls, args.latency, args.repeat, server_process)
        print(
            f"{row['concurrency']:>11} | {row['wall']:>8.2f} | {row['ideal']:>9.2f} | "
            f"{row['overhead']:>7.1f}% | {row['peak']:>21}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
