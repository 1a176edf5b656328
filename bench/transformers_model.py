"""Benchmark: `TransformersModel` answering concurrent calls in batches, on the embedded model.

The embedded SmolLM2-135M-Instruct, converted once to a Hugging Face folder
(`embedded_model_folder()`), answers 64 BIG-bench plurals with 4 demos in the prompt, at
concurrency 1 and at concurrency 16 (calls with the same settings share one `generate`,
up to `max_batch_size=16`), in the same run, with the default settings (a call waits
5 ms for company, at concurrency 1 too). Reported: wall time, the speed-up, the
`generate` calls, and the accuracy (the same answers either way: greedy decoding).

Then calls that arrive one by one, as in a collection: `opto.collect` of 32 examples, 4
samples each at temperature 0.7 (sample k under seed k, so four batches fill at once),
concurrency 16, the agent asked zero-shot. Once with batches sealed when their 5 ms wait
ends (the behaviour before issue 39, patched back in for the run) and once as now (a
batch whose wait ends while the worker is busy goes on filling). Reported: wall time,
`generate` calls and rollouts per generate.

    pip install -e ".[local,trl]"
    python bench/transformers_model.py
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from typing import Any

from opto import ExactMatchGuide, collect
from opto.datasets import bigbench
from opto.llm import TransformersModel
from opto.llm.transformers_model import embedded_model_folder
from opto.recipes.demo import FewShotAgent


def prompt(demos: list[Any], x: str) -> list[dict[str, str]]:
    turns = [t for e in demos for t in ({"role": "user", "content": e.x},
                                        {"role": "assistant", "content": answers(e)[0]})]
    return [{"role": "system", "content": "Answer the question."}, *turns, {"role": "user", "content": x}]


def answers(example: Any) -> list[str]:
    return example.info if isinstance(example.info, list) else [example.info]


async def answer_all(model: TransformersModel, demos: list[Any], test: list[Any], concurrency: int) -> list[str]:
    gate = asyncio.Semaphore(concurrency)

    async def one(example: Any) -> str:
        async with gate:
            reply = await model.complete(prompt(demos, example.x), max_tokens=8, stop=["\n"])
            return reply.text.strip()

    return await asyncio.gather(*(one(e) for e in test))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=64)
    args = parser.parse_args()
    folder = embedded_model_folder()
    demos = bigbench("plural", split="train", n=4, seed=0)
    test = bigbench("plural", split="test", n=args.examples, seed=0)
    rows = []
    for concurrency in (1, 16):
        model = TransformersModel(folder, max_batch_size=16)
        model.load()  # loading and the first call's warm-up are not what is measured
        asyncio.run(answer_all(model, demos, test[:1], 1))
        model.generate_calls = 0
        started = time.perf_counter()
        outputs = asyncio.run(answer_all(model, demos, test, concurrency))
        seconds = time.perf_counter() - started
        accuracy = sum(o in answers(e) for o, e in zip(outputs, test)) / len(test)
        rows.append((concurrency, seconds, model.generate_calls, accuracy, outputs))
    print(f"{args.examples} plurals, SmolLM2-135M-Instruct (float32, CPU); Python {platform.python_version()}, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}\n")
    print("| concurrency | wall time | speed-up | generate calls | accuracy |")
    print("|---:|---:|---:|---:|---:|")
    for concurrency, seconds, calls, accuracy, _ in rows:
        print(f"| {concurrency} | {seconds:.1f} s | {rows[0][1] / seconds:.1f}x | {calls} | {accuracy:.1%} |")
    same = rows[0][4] == rows[1][4]
    print(f"\nthe same answers at both concurrencies: {same}")
    print("\n| collect, 32 x 4 samples | wall time | generate calls | rollouts per generate |")
    print("|---|---:|---:|---:|")
    examples = bigbench("plural", split="train", n=32, seed=0)
    for name, sealed in (("sealed when the wait ends (before)", True), ("filling while the worker is busy (now)", False)):
        model = TransformersModel(folder, max_batch_size=16)
        if sealed:
            model._on_timer = model._flush  # type: ignore[method-assign]
        model.load()
        asyncio.run(answer_all(model, demos, test[:1], 1))
        model.generate_calls = 0
        with tempfile.TemporaryDirectory() as run_dir:
            started = time.perf_counter()
            collect(FewShotAgent(model), ExactMatchGuide(), examples, samples=4, temperature=0.7, run_dir=run_dir,
                    concurrency=16, progress=False)
            seconds = time.perf_counter() - started
        print(f"| {name} | {seconds:.1f} s | {model.generate_calls} | {4 * len(examples) / model.generate_calls:.1f} |")


if __name__ == "__main__":
    sys.exit(main())
