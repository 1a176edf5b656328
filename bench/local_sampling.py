"""JSON replies of the embedded model: llama-cpp-python's grammar on every token against
`LocalModel`'s lazy check (`opto/llm/lazy_grammar.py`), with free text as the floor.

The same prompts, limits and seeds through three llama.cpp setups of the same GGUF file
on the same threads: free text (no grammar: the floor), JSON with llama-cpp-python's
stock `Llama` (the grammar applied to the whole vocabulary before every token), and JSON
with `lazy_grammar_llama` (the drawn token checked, the grammar applied only when it
refuses it). Prints completion tokens per second and the ratios, and whether the greedy
replies of the two JSON setups are the same text.

    python bench/local_sampling.py                  # on every core this process may use
    taskset -c 0 python bench/local_sampling.py     # on one core, as a test worker runs
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from typing import Any

import llama_cpp.llama

from opto.llm.lazy_grammar import lazy_grammar_llama
from opto.llm.local import default_model_path, usable_cpus

PROMPTS = [
    "Write a long, detailed essay about football, basketball and tennis: history, rules, players.",
    "The system prompt 'Answer with one word.' failed on sports questions. Suggest a better one, with reasons.",
    "Describe three fictional people: names, ages, jobs and hobbies.",
]
JSON_FORMAT = {"type": "json_object"}


def run(llama: Any, response_format: dict[str, Any] | None, temperature: float, max_tokens: int) -> tuple[int, float, list[str]]:
    tokens, texts = 0, []
    started = time.perf_counter()
    for seed, prompt in enumerate(PROMPTS):
        reply = llama.create_chat_completion(
            messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=temperature,
            seed=seed, response_format=response_format,
        )
        tokens += reply["usage"]["completion_tokens"]
        texts.append(reply["choices"][0]["message"]["content"] or "")
    return tokens, time.perf_counter() - started, texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-tokens", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each setup; the table shows the median")
    args = parser.parse_args()
    threads = usable_cpus()
    options = {"model_path": str(default_model_path()), "n_ctx": 2048, "n_threads": threads,
               "n_threads_batch": threads, "verbose": False}
    stock = llama_cpp.llama.Llama(**options)
    lazy = lazy_grammar_llama(llama_cpp.llama)(**options)
    setups = [("free text (floor)", stock, None), ("JSON, stock grammar", stock, JSON_FORMAT),
              ("JSON, lazy grammar", lazy, JSON_FORMAT)]
    print(f"# {platform.node()}, {threads} thread(s), load {os.getloadavg()[0]:.2f}, "
          f"max_tokens {args.max_tokens}, median of {args.repeat}")
    print("| setup | temperature | tokens | tok/s | vs floor |")
    print("|---|---:|---:|---:|---:|")
    for temperature in (0.0, 0.8):
        rates, greedy = {}, {}
        for label, llama, response_format in setups:
            runs = sorted((run(llama, response_format, temperature, args.max_tokens) for _ in range(args.repeat)),
                          key=lambda r: r[0] / r[1])
            tokens, seconds, texts = runs[len(runs) // 2]
            rates[label], greedy[label] = tokens / seconds, texts
            print(f"| {label} | {temperature} | {tokens} | {rates[label]:.1f} | "
                  f"{rates[label] / rates['free text (floor)']:.2f} |")
        if temperature == 0.0:
            same = greedy["JSON, stock grammar"] == greedy["JSON, lazy grammar"]
            print(f"| greedy JSON replies, stock and lazy | | | | {'same text' if same else 'DIFFERENT'} |")


if __name__ == "__main__":
    main()
