"""Benchmark: the effect of each DPO and GRPO setting of a chain, one at a time.

`bench/weights.py` runs the chains `sft,dpo` and `sft,grpo` with the recipe's defaults.
This script takes one of those runs (a task and a seed), keeps everything up to the later
stage (the prompt stage, the SFT model, and the SFT model's own samples in
`collect-<stage>`), and trains that stage again under each variant: the defaults, then one
setting changed at a time. Every variant learns from the same samples (but the one that
draws more of them) and is measured on the same 64 held-out examples, paired against the
defaults. Reported: test accuracy, the
change against the defaults with its paired 95% interval, the validation change against
SFT (the chain's keep check), and minutes.

The variants are resumable: run it again with the same --out and it continues.

    pip install -e ".[local,trl]"
    python bench/weights.py --tasks past_tense --seeds 1 --methods sft sft,dpo sft,grpo --out bench/results/weights
    python bench/weights_settings.py --runs bench/results/weights --task past_tense --seed 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from opto.core.stats import paired_test
from opto.recipes.prompts_then_weights import WeightsReport, prompts_then_weights

#: (name, what changes) per method; "defaults" first, the rest against it.
VARIANTS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "dpo": [
        ("defaults", {}),
        ("no likelihood term (loss sigmoid only)", {"finetune": {"config": {"loss_type": ["sigmoid"]}}}),
        ("no gold (pairs only where a sample is right)", {"gold": False}),
        ("beta 0.3 (default 0.1)", {"finetune": {"beta": 0.3}}),
        ("learning rate 3e-4 (default 1e-4)", {"finetune": {"learning_rate": 3e-4}}),
        ("1 epoch (default 2)", {"finetune": {"num_train_epochs": 1.0}}),
        ("8 samples an example (default 4; drawn anew)", {"samples": 8}),
    ],
    "grpo": [
        ("defaults", {}),
        ("no KL term (beta 0, default 0.04)", {"finetune": {"beta": 0.0}}),
        ("no gold (groups of samples only)", {"gold": False}),
        ("learning rate 3e-4 (default 1e-4)", {"finetune": {"learning_rate": 3e-4}}),
        ("1 epoch (default 2)", {"finetune": {"num_train_epochs": 1.0}}),
        ("8 samples an example (default 4; drawn anew)", {"samples": 8}),
    ],
}


def run_variant(chain: Path, folder: Path, method: str, change: dict[str, Any]) -> WeightsReport:
    """The chain's later stage trained again in `folder` with `change` over its settings."""
    settings = json.loads((chain / "pipeline.json").read_text())
    # The stage alone: no second prompt search after it.
    settings = {**settings, "keep": settings.get("keep", "unless-worse"), "again": False, **change}
    if not folder.exists():
        _copy_up_to(chain, folder, method, settings)
    options = {k: v for k, v in settings.items() if k != "method"}
    return prompts_then_weights(run_dir=folder, method=settings["method"], resume=True, progress=False, **options)


def _copy_up_to(chain: Path, folder: Path, method: str, settings: dict[str, Any]) -> None:
    """`chain` without its `method` stage: the same prompt stage, SFT model and samples."""
    folder.mkdir(parents=True)
    (folder / "pipeline.json").write_text(json.dumps(settings))
    lines = [line for line in (chain / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["stage"] not in (method, "prompt-again")]
    (folder / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    same_samples = settings["samples"] == json.loads((chain / "pipeline.json").read_text())["samples"]
    for part in ("prompt", "collect", *([f"collect-{method}"] if same_samples else [])):  # else drawn anew
        shutil.copytree(chain / part, folder / part)
    (folder / "merged-sft").symlink_to((chain / "merged-sft").resolve())  # 0.5 GB, read only
    (folder / "data").mkdir()
    shutil.copy(chain / "data" / "validation-sft.json", folder / "data")
    shutil.copy(chain / "finetune-sft.json", folder)
    models = json.loads((chain / "models.json").read_text())
    (folder / "models.json").write_text(json.dumps({"switches": models["switches"][:1]}))  # SFT's switch only


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", required=True, help="bench/weights.py's --out, with the chains of --task/--seed")
    parser.add_argument("--task", default="past_tense")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--methods", nargs="+", default=["dpo", "grpo"], choices=sorted(VARIANTS))
    parser.add_argument("--out", default="bench/results/weights-settings", help="where the variants are")
    args = parser.parse_args(argv)
    started = time.monotonic()
    rows = ["| method | variant | test accuracy | vs defaults (paired 95% interval) | validation vs SFT | "
            "minutes |", "| --- | --- | --- | --- | --- | --- |"]
    for method in args.methods:
        chain = Path(args.runs) / f"{args.task}-s{args.seed}-sft-{method}"
        if not chain.exists():
            parser.error(f"{chain} not found: run bench/weights.py --methods sft sft,{method} first")
        base: list[float | None] = []
        for i, (name, change) in enumerate(VARIANTS[method]):
            report = run_variant(chain, Path(args.out) / f"{args.task}-s{args.seed}-{method}-{i}", method, change)
            stage = report.stage(method)
            assert stage is not None
            base = base or stage.scores
            versus = "" if i == 0 else _paired(base, stage.scores)
            valid = ("" if stage.validation_change is None else
                     f"{100 * stage.validation_change:+.1f}" + ("" if stage.kept else " (not kept)"))
            rows.append(f"| {method} | {name} | {100 * stage.test_accuracy:.1f}% | {versus} | {valid} | "
                        f"{stage.seconds / 60:.1f} |")
            print(rows[-1], flush=True)
    print(f"\n# {args.task} seed {args.seed} on {platform.machine()}, {os.cpu_count()} cores, python "
          f"{sys.version.split()[0]}, load {os.getloadavg()[0]:.1f} at the end, "
          f"{(time.monotonic() - started) / 60:.1f} min this call")
    print("\n".join(rows))
    return 0


def _paired(before: list[float | None], after: list[float | None]) -> str:
    change = paired_test(before, after)
    low, high = change.interval.low, change.interval.high
    return f"{100 * change.difference:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"


if __name__ == "__main__":
    raise SystemExit(main())
