"""`opto report` on a prompts-then-weights run (`opto demo --finetune`): one bar per stage.

The stages' lines of ``metrics.jsonl`` become ``report.png`` (test accuracy with its 95%
interval per stage, and the prompt tokens per call on a second axis) and ``report.md``
(a table of the figures, and each stage's system prompt and demos). A weights stage the
chain did not go on with (it was less accurate on the validation examples than the model
before it) is drawn hatched in grey, and the table says so and by how much.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._util.files import atomic_write_text, read_jsonl

__all__ = ["is_stage_run", "kept_text", "read_stages", "stage_report"]

SETTINGS_FILE = "pipeline.json"


def is_stage_run(folder: Path) -> bool:
    """Whether `folder` holds a prompts-then-weights run."""
    return (folder / SETTINGS_FILE).is_file()


def read_stages(folder: Path) -> list[dict[str, Any]]:
    """The metrics line of every finished stage, in order."""
    path = folder / "metrics.jsonl"
    return [m for m in read_jsonl(path) if isinstance(m, dict) and m.get("stage")] if path.exists() else []


def stage_report(folder: Path, target: Path, *, draw: bool = True) -> tuple[Path, Path, list[dict[str, Any]]]:
    """Write report.png and report.md for the stages in `folder`; returns their paths and the stages.

    With `draw=False` (no matplotlib) only report.md is written; the picture's path is still returned.
    """
    stages = read_stages(folder)
    png, markdown = target / "report.png", target / "report.md"
    if draw:
        _plot(png, stages, f"prompts, then weights: {folder.resolve().name}")
    atomic_write_text(markdown, _markdown(folder, stages))
    return png, markdown, stages


def _plot(path: Path, stages: list[dict[str, Any]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    if not stages:
        ax.set_title(f"{title} (no stage finished yet)")
        fig.savefig(path)
        plt.close(fig)
        return
    names = [s["stage"] for s in stages]
    accuracy = [100 * s["test_accuracy"] for s in stages]
    low = [a - 100 * s["test_interval"][0] for a, s in zip(accuracy, stages)]
    high = [100 * s["test_interval"][1] - a for a, s in zip(accuracy, stages)]
    positions = range(len(stages))
    dropped = [s.get("kept") is False for s in stages]
    ax.bar(
        positions,
        accuracy,
        width=0.6,
        color=["tab:gray" if d else "tab:green" for d in dropped],
        hatch=[("//" if d else "") for d in dropped],
        label="test accuracy" + (" (hatched: a stage not kept)" if any(dropped) else ""),
    )
    ax.errorbar(positions, accuracy, yerr=[low, high], fmt="none", ecolor="black", capsize=5, label="95% interval")
    ax.set_ylim(0, 100)
    ax.set_ylabel("test accuracy (%)")
    ax.set_xticks(list(positions), names)
    tokens = ax.twinx()
    tokens.plot(
        list(positions),
        [s["prompt_tokens_per_call"] for s in stages],
        "o:",
        color="tab:gray",
        label="prompt tokens per call (right axis)",
    )
    tokens.set_ylabel("prompt tokens per call")
    tokens.set_ylim(bottom=0)
    handles, labels = ax.get_legend_handles_labels()
    more_handles, more_labels = tokens.get_legend_handles_labels()
    fig.legend(handles + more_handles, labels + more_labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    ax.set_title(title)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path)
    plt.close(fig)


def _markdown(folder: Path, stages: list[dict[str, Any]]) -> str:
    lines = [
        f"# Prompts, then weights: {folder}",
        "",
        "| stage | test accuracy | 95% interval | prompt tokens / call | calls | seconds | model | kept |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in stages:
        low, high = s["test_interval"]
        lines.append(
            f"| {s['stage']} | {100 * s['test_accuracy']:.1f}% | [{100 * low:.1f}, {100 * high:.1f}] | "
            f"{s['prompt_tokens_per_call']:.1f} | {s['calls']} | {s['seconds']:.1f} | {s['model']} | {kept_text(s)} |"
        )
    if not stages:
        lines.append("| (no stage finished yet) | | | | | | | |")
    for s in stages:
        values = s.get("parameters") or {}
        demos = values.get("demos") or []
        lines += [
            "",
            f"## {s['stage']}",
            "",
            f"- system prompt: {values.get('system_prompt')!r}",
            "- demos: " + (", ".join(f"{d.get('input')!r} -> {d.get('output')!r}" for d in demos) or "none"),
        ]
        if s.get("train_records"):
            lines.append(f"- trained on {s['train_records']} records")
    return "\n".join(lines) + "\n"


def kept_text(stage: dict[str, Any]) -> str:
    """Whether the chain went on with a weights stage's model, and why (blank for a prompt stage)."""
    if stage.get("kept") is None:
        return ""
    change = stage.get("validation_change")
    versus = f"{100 * change:+.1f} points vs {stage.get('compared_with')} on validation" if change is not None else ""
    return ("yes" if stage["kept"] else "no") + (f" ({versus})" if versus else "")
