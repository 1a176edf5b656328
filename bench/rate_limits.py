"""Benchmark: training instances against a rate-limited server lose nothing.

32 instances run at once; each makes the two calls of a training instance (the agent's,
then the optimizer's) through one `OpenAIModel`, against `FakeOpenAIServer` allowing
`rate` requests per second (a token bucket of one second's worth; beyond it a 429 with
Retry-After). Reported per server rate and client setting: failed instances (target 0),
throughput against the allowed rate (target within 10%; the bucket's first second's
worth goes at once and is left out of it), the 429s the server sent and the wall time
against the ideal. The server runs in a child process, as a real one would.

    python bench/rate_limits.py
    python bench/rate_limits.py --instances 64 --rates 5 16 32 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import os
import platform
import statistics
import sys
import time
from typing import Any

from opto.llm import LLMError, OpenAIModel
from opto.testing import FakeOpenAIServer

AGENT = [{"role": "user", "content": "How many legs does a spider have?"}]
OPTIMIZER = [{"role": "system", "content": "You improve the parameters of an AI agent."},
             {"role": "user", "content": "The agent answered 6; the answer is 8. Suggest a better prompt."}]


def _serve(conn: Any, rate: float) -> None:
    """Child process: a rate-limited FakeOpenAIServer; answers "stats" with (accepted, refused)."""
    with FakeOpenAIServer(rate_limit_rps=rate) as server:
        conn.send(server.base_url)
        while conn.recv() == "stats":
            conn.send((len(server.chat_requests) - server.rate_limited, server.rate_limited))


async def _instance(model: OpenAIModel) -> bool:
    try:
        await model.complete(AGENT)
        await model.complete(OPTIMIZER)
        return True
    except LLMError:
        return False


async def _run(base_url: str, instances: int, requests_per_minute: int | None) -> tuple[int, float]:
    model = OpenAIModel("bench", base_url=base_url, api_key="bench", max_concurrency=32,
                        requests_per_minute=requests_per_minute)
    try:
        started = time.perf_counter()
        results = await asyncio.gather(*(_instance(model) for _ in range(instances)))
        return results.count(False), time.perf_counter() - started
    finally:
        await model.aclose()


def measure(rate: float, instances: int, client_limit: bool) -> dict[str, float]:
    parent, child = multiprocessing.Pipe()
    process = multiprocessing.Process(target=_serve, args=(child, rate), daemon=True)
    process.start()
    try:
        base_url = parent.recv()
        time.sleep(1.0)  # the server's bucket starts full: let it settle as a busy server's would not
        parent.send("stats")
        before_ok, before_refused = parent.recv()
        rpm = int(rate * 60) if client_limit else None
        failed, wall = asyncio.run(_run(base_url, instances, rpm))
        parent.send("stats")
        accepted, refused = parent.recv()
    finally:
        parent.send("stop")
        process.join(5)
    accepted -= before_ok
    # The bucket holds one second's worth at the start: those requests go at once, the rest
    # at `rate` per second at best.
    burst = max(1.0, rate)
    return {"failed": failed, "wall": wall, "throughput": (accepted - burst) / wall,
            "refused": refused - before_refused, "ideal": max(0.0, (accepted - burst) / rate), "accepted": accepted}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=32)
    parser.add_argument("--rates", type=float, nargs="+", default=[5, 16])
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # every 429 is logged as a warning: keep the table readable
    print(f"# {platform.machine()} {os.cpu_count()} cores, Python {sys.version.split()[0]}, "
          f"load average {os.getloadavg()[0]:.2f}; {args.instances} instances x 2 calls, median of {args.repeat}")
    print("| server limit (req/s) | client setting | failed instances | throughput (req/s) | of allowed "
          "| wall (s) | ideal wall (s) | 429s sent |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for rate in args.rates:
        for client_limit in (False, True):
            runs = [measure(rate, args.instances, client_limit) for _ in range(args.repeat)]
            pick = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
            setting = f"requests_per_minute={int(rate * 60)}" if client_limit else "none (retries only)"
            print(f"| {rate:g} | {setting} | {pick['failed']:.0f} | {pick['throughput']:.2f} | "
                  f"{100 * pick['throughput'] / rate:.0f}% | {pick['wall']:.2f} | {pick['ideal']:.2f} | "
                  f"{pick['refused']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
