"""Benchmark of one training step against its critical path, on the offline fake server.

One `AggregatedUpdate` step on B examples: agent (one model call) -> guide (no call) ->
optimizer (one call per instance) -> aggregator (one call, `num_candidates` samples) ->
validation (for "minibatch": the batch again under each candidate). Every call goes
through `OpenAIModel` to `FakeOpenAIServer` in a child process, whose latency is drawn
per request from a seeded lognormal distribution (or fixed).

The critical path is computed from the latencies the server actually drew:

    max over instances (agent + optimizer) + aggregator [+ the slowest validation call]

so `wall / critical path` is what the trainer adds on top of the model calls it cannot
avoid waiting for. Also reported: client CPU per LLM call (this process's CPU time over
the step, divided by its calls), the server's peak requests in flight, and the
aggregator's calls and prompt tokens.

    python bench/step_pipeline.py                       # the full table: the median run of 3
    python bench/step_pipeline.py --batch 32 --repeat 9
    python bench/step_pipeline.py --cpu-only             # zero latency, B = 32: CPU per call
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import re
import sys
import time
from typing import Any

from fake_server_process import fake_server

from opto import Agent, AggregatedUpdate, Aggregator, ExactMatchGuide, Optimizer, Parameter
from opto.llm import OpenAIModel
from opto.testing import LognormalLatency

START_PROMPT = "Answer the question."
ITEM = re.compile(r"item-\d{4}")


def reply(body: dict[str, Any]) -> list[str]:
    """The fake server's answer, by the model the request names (module level: it is pickled)."""
    n = body.get("n") or 1
    model = body.get("model")
    if model == "agent":
        return ["no"] * n
    if model == "optimizer":
        item = ITEM.search(json.dumps(body["messages"]))
        suggestion = {"system_prompt": f"Answer the question; mind {item.group(0) if item else 'it'}."}
        return [json.dumps({"reasoning": "be careful", "suggestion": suggestion})] * n
    return [json.dumps({"reasoning_system_prompt": "merge", "suggestion": {"system_prompt": f"Say yes ({i})."}})
            for i in range(n)]


class QuestionAgent(Agent):
    def __init__(self, model: OpenAIModel) -> None:
        self.model = model
        self.system_prompt = Parameter(START_PROMPT, description="the agent's system prompt")

    async def forward(self, question: str) -> str:
        messages = [{"role": "system", "content": self.system_prompt.value}, {"role": "user", "content": question}]
        return (await self.model.complete(messages)).text


def models(base_url: str, concurrency: int) -> dict[str, OpenAIModel]:
    return {name: OpenAIModel(name, base_url=base_url, api_key="bench", max_concurrency=concurrency)
            for name in ("agent", "optimizer", "aggregator")}


def one_step(llms: dict[str, OpenAIModel], batch: int, validation: str, candidates: int) -> dict[str, Any]:
    """Train for one step on `batch` examples; returns wall and CPU seconds and the usage."""
    data = [{"x": f"Is item-{i:04d} on the list?", "info": "yes", "id": f"q{i}"} for i in range(batch)]
    trainer = AggregatedUpdate(
        QuestionAgent(llms["agent"]), Optimizer(llms["optimizer"]),
        aggregator=Aggregator(llms["aggregator"], num_candidates=candidates),
        validation=validation, concurrency=max(16, batch),
        proposals="per_instance",  # the pipeline this measures: one optimizer call per instance
    )
    wall, cpu = time.perf_counter(), time.process_time()
    result = trainer.train(ExactMatchGuide(), data, batch_size=batch, progress=False, shuffle=False)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if result.steps != 1 or result.stopped_reason:
        raise RuntimeError(f"expected one finished step, got {result.steps} ({result.stopped_reason})")
    return {"wall": wall, "cpu": cpu, "usage": result.usage_by_model}


def critical_path(calls: list[tuple[dict[str, Any], float]], batch: int, validation: str) -> float:
    """The step's critical path from the latencies the server drew for its calls."""
    agent: dict[str, float] = {}
    optimizer: dict[str, float] = {}
    aggregator = 0.0
    validating: list[float] = []
    for body, latency in calls:
        model = body["model"]
        item = ITEM.search(json.dumps(body["messages"]))
        if model == "aggregator":
            aggregator += latency  # one call; grouped merges would run in sequence
        elif model == "optimizer":
            optimizer[item.group(0)] = latency  # type: ignore[union-attr]
        elif body["messages"][0]["content"] == START_PROMPT:
            agent[item.group(0)] = latency  # type: ignore[union-attr]
        else:
            validating.append(latency)
    if len(agent) != batch or len(optimizer) != batch:
        raise RuntimeError(f"matched {len(agent)} agent and {len(optimizer)} optimizer calls to {batch} instances")
    path = max(agent[item] + optimizer[item] for item in agent) + aggregator
    if validation == "minibatch":
        path += max(validating)
    return path


def measure(batch: int, validation: str, candidates: int, latency: Any, separate_process: bool) -> dict[str, Any]:
    """One step with fresh models and server, after a warm-up step at zero latency."""
    with fake_server(separate_process, reply=reply) as server:
        # Enough slots for every call a step can have in flight (all candidates' validations
        # at once), so what is measured is the pipeline, not a concurrency cap.
        llms = models(server.base_url, concurrency=batch * (candidates + 1))
        try:
            one_step(llms, batch, validation, candidates)  # warm-up: loops, clients, connections
            gc.collect()  # a full collection (about 90 ms here) would otherwise land in some steps
            before = len(server.latencies())
            server.set_latency(latency)
            run = one_step(llms, batch, validation, candidates)
            calls = server.latencies()[before:]
            peak, _ = server.stats()
        finally:
            for llm in llms.values():
                llm.close()
    aggregator_usage = run["usage"].get("aggregator")
    path = critical_path(calls, batch, validation)
    return {
        "wall": run["wall"],
        "path": path,
        "ratio": run["wall"] / path if path else float("nan"),
        "cpu_per_call_ms": run["cpu"] / len(calls) * 1000,
        "calls": len(calls),
        "peak": peak,
        "aggregator_calls": sum(1 for body, _ in calls if body["model"] == "aggregator"),
        "aggregator_tokens": aggregator_usage.prompt_tokens if aggregator_usage else 0,
    }


def median_run(repeat: int, latency: Any, **kwargs: Any) -> dict[str, Any]:
    """The run with the median wall/path ratio out of `repeat`; run i draws its
    latencies with seed + i."""
    runs = [measure(latency=LognormalLatency(latency.median, latency.sigma, latency.seed + i)
                    if isinstance(latency, LognormalLatency) else latency, **kwargs) for i in range(repeat)]
    runs.sort(key=lambda run: (run["ratio"] if run["path"] else 0.0, run["cpu_per_call_ms"]))
    return runs[len(runs) // 2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--validation", nargs="+", default=["none", "minibatch"])
    parser.add_argument("--candidates", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--median", type=float, default=0.1, help="median latency in seconds")
    parser.add_argument("--sigma", type=float, default=0.5, help="lognormal sigma (0: fixed latency)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3, help="runs per setting; medians are shown")
    parser.add_argument("--cpu-only", action="store_true", help="only the zero-latency CPU rows (B = 32)")
    parser.add_argument("--server-in-process", action="store_true",
                        help="run the fake server in this process (its CPU then counts against the client)")
    args = parser.parse_args(argv)
    separate = not args.server_in_process

    print(f"Python {platform.python_version()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"server in {'a child process' if separate else 'this process'}; median of {args.repeat}")
    header = (f"{'latency':>17} | {'B':>4} | {'validation':>10} | {'cand':>4} | {'wall (s)':>8} | {'path (s)':>8} | "
              f"{'wall/path':>9} | {'CPU/call':>8} | {'calls':>5} | {'peak':>4} | {'agg calls':>9} | {'agg tokens':>10}")
    rows: list[tuple[str, Any, int, str, int]] = []
    if not args.cpu_only:
        latency = LognormalLatency(args.median, args.sigma, args.seed) if args.sigma else args.median
        name = f"lognormal {args.median:g}/{args.sigma:g}" if args.sigma else f"fixed {args.median:g} s"
        rows += [(name, latency, b, v, c) for b in args.batch for v in args.validation for c in args.candidates]
    rows += [("zero", 0.0, 32, v, 1) for v in args.validation]
    print(header)
    print("-" * len(header))
    for name, latency, batch, validation, candidates in rows:
        row = median_run(args.repeat, batch=batch, validation=validation, candidates=candidates,
                         latency=latency, separate_process=separate)
        print(f"{name:>17} | {batch:>4} | {validation:>10} | {candidates:>4} | {row['wall']:>8.3f} | "
              f"{row['path']:>8.3f} | {row['ratio']:>9.2f} | {row['cpu_per_call_ms']:>5.2f} ms | {row['calls']:>5.0f} | "
              f"{row['peak']:>4.0f} | {row['aggregator_calls']:>9.0f} | {row['aggregator_tokens']:>10.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
