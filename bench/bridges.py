"""Benchmark: the GEPA bridge's wall time against `gepa.optimize`, the same call, at a model latency.

One `gepa.optimize` call (GEPA's `DefaultAdapter` on a task model given by its LiteLLM
name, a reflection model by its name, a metric-call budget) goes to GEPA and, unchanged,
to `opto.integrations.gepa.optimize`. Both models are behind one `FakeOpenAIServer` that
waits `--latency` seconds before each reply: the task model answers a capital only when
its system prompt asks for the capital city, the reflection model proposes that once it
has seen a failure (GEPA's ``` prompt or opto's JSON one). Runs alternate (GEPA, opto,
GEPA, ...); the table gives each side's median wall time, metric calls, model requests and
held-out accuracy, and the ratio of the medians (opto / GEPA).

    pip install gepa==0.1.4                     # opto's gepa extra
    python bench/bridges.py                     # latency 0.2 s, budget 150, 3 runs each
    python bench/bridges.py --latency 0.05 --budget 80 --runs 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: LiteLLM's own price map
import gepa  # noqa: E402
import litellm  # noqa: E402
from gepa.adapters.default_adapter.default_adapter import DefaultAdapter  # noqa: E402

from opto.integrations import gepa as bridge  # noqa: E402
from opto.testing import FakeOpenAIServer  # noqa: E402

litellm.suppress_debug_info = True  # its "Provider List" banner on every unpriced model name

COUNTRIES = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Peru": "Lima", "Japan": "Tokyo",
             "Kenya": "Nairobi", "Egypt": "Cairo", "Chile": "Santiago", "Ghana": "Accra", "Nepal": "Kathmandu",
             "Cuba": "Havana", "Fiji": "Suva", "Laos": "Vientiane", "Mali": "Bamako", "Oman": "Muscat",
             "Togo": "Lome", "Iran": "Tehran", "Iraq": "Baghdad", "Chad": "Ndjamena", "Sudan": "Khartoum",
             "Qatar": "Doha", "Yemen": "Sanaa", "Gabon": "Libreville", "Benin": "Porto-Novo",
             "Niger": "Niamey", "Syria": "Damascus", "Malta": "Valletta", "Tonga": "Nukualofa",
             "Samoa": "Apia", "Palau": "Ngerulmud"}  # fmt: skip
RULE = "Answer with the capital city of the country, in one word."


def rows(names: list[str]) -> list[dict[str, Any]]:
    return [{"input": f"What is the capital of {n}?", "answer": COUNTRIES[n], "additional_context": {}} for n in names]


def reply(body: dict[str, Any]) -> str:
    """The task model and the reflection model (GEPA's prompt or opto's)."""
    texts = "\n".join(m["content"] for m in body["messages"] if isinstance(m.get("content"), str))
    if "within ``` blocks" in texts:
        return f"```\n{RULE}\n```"
    if "improve the parameters" in texts:
        return json.dumps({"reasoning": "ask for the capital", "suggestion": {"system_prompt": RULE}})
    system, question = body["messages"][0]["content"], body["messages"][-1]["content"]
    country = question.rsplit(" ", 1)[-1].rstrip("?")
    return COUNTRIES.get(country, "?") if "capital city" in system else f"{country} is a country."


def one_run(side: str, budget: int, seed: int) -> dict[str, Any]:
    names = list(COUNTRIES)
    call = dict(seed_candidate={"system_prompt": "You are a helpful assistant."}, trainset=rows(names[:10]),
                valset=rows(names[10:20]), task_lm="openai/task-model", reflection_lm="openai/reflection-model",
                max_metric_calls=budget, seed=seed, display_progress_bar=False)  # fmt: skip
    started = time.perf_counter()
    if side == "gepa":
        found = gepa.optimize(**call, logger=_Quiet())
        calls = found.total_metric_calls
    else:
        found = bridge.optimize(**call)
        calls = found.total_metric_calls
    seconds = time.perf_counter() - started
    test = DefaultAdapter(model="openai/task-model").evaluate(rows(names[20:]), found.best_candidate).scores
    return {"seconds": seconds, "metric_calls": calls, "accuracy": sum(test) / len(test)}


class _Quiet:
    def log(self, message: str) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--budget", type=int, default=150)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {"gepa": [], "opto": []}
    with FakeOpenAIServer(reply, latency=args.latency) as server:
        os.environ["OPENAI_API_BASE"] = server.base_url
        os.environ["OPENAI_API_KEY"] = "test-key"
        for run in range(args.runs):
            for side in ("gepa", "opto"):
                before = len(server.chat_requests)
                found = one_run(side, args.budget, seed=run)
                found["requests"] = len(server.chat_requests) - before
                results[side].append(found)
                print(f"run {run} {side}: {found}", file=sys.stderr)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; "
          f"latency {args.latency} s, budget {args.budget} metric calls, {args.runs} runs each")  # fmt: skip
    print("| side | wall time (median, s) | metric calls | model requests (incl. held-out) | held-out accuracy |")
    print("|---|---|---|---|---|")
    for side, found in results.items():
        med = {key: statistics.median(r[key] for r in found) for key in found[0]}
        print(f"| {side} | {med['seconds']:.1f} | {med['metric_calls']:.0f} | {med['requests']:.0f} | "
              f"{med['accuracy']:.2f} |")  # fmt: skip
    ratio = statistics.median(r["seconds"] for r in results["opto"]) / statistics.median(
        r["seconds"] for r in results["gepa"]
    )
    print(f"\nopto / gepa wall time: {ratio:.2f}x")


if __name__ == "__main__":
    main()
