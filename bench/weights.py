"""Benchmark: prompts, then weights, on the embedded SmolLM2-135M-Instruct (`opto.recipes.prompts_then_weights`).

For each task and seed, the chain `opto demo --finetune sft` runs (zero-shot, the prompt
stage, SFT on the optimized agent's correct answers asked zero-shot, the prompt again
with the tuned model), then DPO and GRPO from the same prompt stage and the same
collected answers (their run directories start as copies of the SFT chain's first two
stages and its collection, so the three methods learn from identical data); and the
chains `sft,dpo` and `sft,grpo`, which go on from the SFT chain's SFT stage (the same
tuned model) to DPO or GRPO on that model's own samples, each checked on 64 validation
examples against SFT (`keep="unless-worse"`). Every stage is measured on the same 64
held-out examples. Reported per task and stage: test accuracy (mean over seeds, each
seed's, and the 95% interval of all seeds' answers pooled), prompt tokens per test call,
model calls, and minutes; and the last stage against the prompt stage (for a chain, which
ends with the prompt searched again on the model it kept, also its DPO or GRPO stage
against the prompt stage and against SFT), paired over the same examples.

The runs are resumable: run it again with the same --out and it continues.

    pip install -e ".[local,trl]"
    python bench/weights.py                              # plural and past_tense, 3 seeds, sft dpo grpo
    python bench/weights.py --tasks plural --methods sft # the figures the README quotes
    python bench/weights.py --methods sft sft,dpo sft,grpo   # the chains
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

from opto.core.stats import paired_test, score_interval
from opto.recipes.prompts_then_weights import WeightsReport, prompts_then_weights

SETTINGS = {"train_n": 12, "validation_n": 24, "test_n": 64, "collect_n": 256, "samples": 4, "temperature": 0.7}


METHODS = ["sft", "dpo", "grpo", "sft,dpo", "sft,grpo"]


def copied_stages(method: str) -> tuple[str, ...]:
    """The stages a run copies from the SFT chain instead of running them itself."""
    if method == "sft":
        return ()
    return ("zero-shot", "prompt", "sft") if method.startswith("sft,") else ("zero-shot", "prompt")


def run_method(out: Path, task: str, seed: int, method: str) -> WeightsReport:
    folder = out / f"{task}-s{seed}-{method.replace(',', '-')}"
    if method != "sft" and not folder.exists():
        _start_from_sft_chain(out / f"{task}-s{seed}-sft", folder, method)
    again = method == "sft" or method.startswith("sft,")  # a chain ends with the prompt searched again
    return prompts_then_weights(run_dir=folder, method=method, again=again, task=task, seed=seed,
                                resume=folder.exists(), progress=False, **SETTINGS)


def _start_from_sft_chain(chain: Path, folder: Path, method: str) -> None:
    """A DPO or GRPO run begins where the SFT chain's collection ended: same prompt stage,
    same answers; a chain after SFT also takes the SFT stage, its job and its switch."""
    folder.mkdir(parents=True)
    settings = json.loads((chain / "pipeline.json").read_text())
    again = method.startswith("sft,")
    (folder / "pipeline.json").write_text(json.dumps({**settings, "method": method, "again": again}))
    lines = [line for line in (chain / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["stage"] in copied_stages(method)]
    (folder / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    for part in ("prompt", "collect"):
        shutil.copytree(chain / part, folder / part)
    if "sft" in copied_stages(method):  # the switch points at the SFT chain's adapter, which stays there
        for name in ("models.json", "finetune-sft.json"):
            shutil.copy(chain / name, folder / name)


def table(reports: list[WeightsReport]) -> list[str]:
    rows = ["| task | stage | test accuracy (mean) | per seed | 95% interval (pooled) | prompt tokens / call | "
            "calls | minutes |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    order = ("zero-shot", "prompt", "sft", "dpo", "grpo", "prompt-again")
    for task in dict.fromkeys(r.task for r in reports):
        for method in dict.fromkeys(r.method for r in reports):
            for stage in order:
                found = [s for r in reports if r.task == task and r.method == method for s in r.stages
                         if s.stage == stage and stage not in copied_stages(method)]
                if found:
                    rows.append(_row(task, stage if method in ("sft", stage) else f"{stage} ({method})", found))
    return rows


def _row(task: str, stage: str, found: list) -> str:
    pooled = score_interval([x for s in found for x in s.scores])
    return (f"| {task} | {stage} | {100 * statistics.mean(s.test_accuracy for s in found):.1f}% | "
            + " / ".join(f"{100 * s.test_accuracy:.1f}" for s in found)
            + f" | [{100 * pooled.low:.1f}, {100 * pooled.high:.1f}] | "
            f"{statistics.mean(s.prompt_tokens_per_call for s in found):.1f} | "
            f"{statistics.mean(s.calls for s in found):.0f} | {statistics.mean(s.seconds for s in found) / 60:.1f} |")


def paired_rows(reports: list[WeightsReport]) -> list[str]:
    """Each method's last stage against the prompt stage, paired over every seed's
    examples; for a chain also its weights stage (DPO or GRPO, kept or not) against the
    prompt stage and against SFT."""
    rows = []
    for task in dict.fromkeys(r.task for r in reports):
        for method in dict.fromkeys(r.method for r in reports):
            chosen = [r for r in reports if r.task == task and r.method == method]
            ends = [("last stage", [r.stages[-1] for r in chosen], ("prompt",))]
            if method.startswith("sft,"):
                weights = method.split(",")[-1]
                ends.append(("weights stage", [r.stage(weights) for r in chosen], ("prompt", "sft")))
            for what, stages, baselines in ends:
                for baseline in baselines:
                    before = [x for r in chosen for x in r.stage(baseline).scores]  # type: ignore[union-attr]
                    after = [x for s in stages for x in s.scores]  # type: ignore[union-attr]
                    if not chosen or len(before) != len(after):
                        continue
                    change = paired_test(before, after)
                    kept = [s.kept for s in stages]  # type: ignore[union-attr]
                    note = f", kept in {sum(map(bool, kept))} of {len(kept)} seeds" if kept[0] is not None else ""
                    rows.append(f"{task}: {what}, {stages[0].stage} ({method}{note}) vs {baseline} over "  # type: ignore[union-attr]
                                f"{len(before)} paired examples: {100 * change.difference:+.1f} points, 95% interval "
                                f"[{100 * change.interval.low:+.1f}, {100 * change.interval.high:+.1f}]")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["plural", "past_tense"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", default=["sft", "dpo", "grpo"], choices=METHODS)
    parser.add_argument("--out", default="bench/results/weights", help="where the runs are (and resume from)")
    args = parser.parse_args(argv)
    if "sft" not in args.methods:
        parser.error("--methods needs sft: the others start from the SFT chain's prompt stage and collection")
    out = Path(args.out)
    started = time.monotonic()
    reports = [run_method(out, task, seed, method) for method in args.methods for task in args.tasks
               for seed in args.seeds]
    load = os.getloadavg()
    print(f"# prompts, then weights on {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"python {sys.version.split()[0]}, load {load[0]:.1f} at the end; {len(reports)} runs, "
          f"{(time.monotonic() - started) / 60:.1f} min this call")
    print("\n".join(table(reports)))
    print()
    print("\n".join(paired_rows(reports)))
    (out / "summary.json").write_text(json.dumps([r.model_dump(mode="json") for r in reports], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
