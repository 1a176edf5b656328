"""Benchmark: `TransformersModel` answering concurrent calls in batches, on the embedded model.

The embedded SmolLM2-135M-Instruct, converted once to a Hugging Face folder
(`embedded_model_folder()`), answers 64 BIG-bench plurals with 4 demos in the prompt, at
concurrency 1 and at concurrency 16 (calls with the same settings share one `generate`,
up to `max_batch_size=16`), in the same run, with the default settings (a call waits
5 ms for company, at concurrency 1 too). Reported: wall time, the speed-up, the
`generate` calls, and the accuracy (the same answers either way: greedy decoding).

    pip install -e ".[local,trl]"
    python bench/transformers_model.py
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from typing import Any

from opto.datasets import bigbench
from opto.llm import TransformersModel
from opto.llm.transformers_model import embedded_model_folder


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


if __name__ == "__main__":
    sys.exit(main())
