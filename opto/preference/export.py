"""One call from a run directory to a fine-tuning file: read turns, build, split, write."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ..errors import OptoValueError
from .pairs import BuilderStats, PreferencePairBuilder
from .split import train_validation_split
from .trajectories import GroupStats, read_groups
from .turns import read_turns
from .writers import get_writer

__all__ = ["ExportReport", "export_run", "validation_path"]

logger = logging.getLogger(__name__)


class ExportReport(BaseModel):
    """What `export_run` wrote."""

    run_dir: str
    source: str
    format: str
    out: str
    records: int
    validation_out: str | None = None
    validation_records: int = 0
    stats: BuilderStats = Field(default_factory=BuilderStats)
    unused: dict[str, int] = Field(default_factory=dict)
    groups: GroupStats | None = None  # the "art" format's counts


def validation_path(out: str | Path) -> Path:
    """Where the validation split of `out` goes: ``pairs.jsonl`` -> ``pairs.validation.jsonl``."""
    out = Path(out)
    suffix = out.suffix or ".jsonl"
    return out.with_name(f"{out.stem if out.suffix else out.name}.validation{suffix}")


def export_run(
    run_dir: str | Path,
    out: str | Path,
    *,
    source: str = "all",
    format: str = "openai-dpo",
    validation_fraction: float = 0.0,
    seed: int = 0,
    builder: PreferencePairBuilder | None = None,
    tokenizer: Any = None,
    nemo_prompt: str | None = None,
    min_score: float | None = None,
) -> ExportReport:
    """Export the preference data of a run to `out` (and its validation split).

    Args:
        run_dir: a training run's directory (holding ledger.jsonl), or its ledger.jsonl.
        out: the JSONL file to write; its folder must exist.
        source: "optimizer", "aggregator", "agent" or "all".
        format: "openai-dpo", "openai-sft", "trl", "trl-chat", "nemo", or "art" (trajectory
            groups for RL, from the rollouts: `source` does not apply).
        validation_fraction: the share of examples written to `validation_path(out)`.
        seed: the split's seed.
        builder: the pair builder (default settings when None).
        tokenizer: "trl" only: the target model's tokenizer or model folder, whose chat
            template renders the prompts.
        nemo_prompt: "nemo" only: "messages" (default) or "string" (the last message).
        min_score: supervised formats only: export every complete response scoring at
            least this, single candidate or not (default: each turn's best response, when
            it beats another one).

    Raises `ValueError` when nothing can be exported, saying why.
    """
    run_dir = Path(run_dir)
    if run_dir.name == "ledger.jsonl" and run_dir.is_file():
        run_dir = run_dir.parent  # the ledger itself was named: its run directory is meant
    if not Path(out).parent.is_dir():
        raise OptoValueError(f"the folder of --out {out} does not exist; create it first (mkdir -p {Path(out).parent})")
    writer = get_writer(format, tokenizer=tokenizer, prompt=nemo_prompt)
    if min_score is not None and writer.kind != "supervised":
        raise OptoValueError(
            f"--min-score picks replies for supervised data (format openai-sft), not for {format}"
            + ("; pairs are controlled by --min-score-diff" if writer.kind == "pairs" else "")
        )
    if writer.kind == "groups":
        return _export_groups(run_dir, out, writer, validation_fraction, seed)
    builder = builder or PreferencePairBuilder()
    reading = read_turns(run_dir, source)
    items: list[Any]
    if writer.kind == "supervised":
        items = builder.best_responses(reading.turns, min_score=min_score)
    else:
        items = builder.build(reading.turns)
    if not items:
        raise OptoValueError(
            _nothing_exported(
                run_dir,
                source,
                builder.stats,
                reading.unscored,
                supervised=writer.kind == "supervised",
                min_score=min_score,
            )
        )
    train, validation = train_validation_split(items, validation_fraction, seed=seed)
    report = ExportReport(
        run_dir=str(run_dir),
        source=source,
        format=format,
        out=str(out),
        records=writer.write(train, out),
        stats=builder.stats,
        unused=reading.unscored,
    )
    if validation_fraction > 0:
        target = validation_path(out)
        report.validation_out = str(target)
        report.validation_records = writer.write(validation, target)
    return report


def _export_groups(run_dir: Path, out: str | Path, writer: Any, validation_fraction: float, seed: int) -> ExportReport:
    """The "art" format: a run's rollouts as trajectory groups, one per example per step."""
    reading = read_groups(run_dir)
    stats = reading.stats
    if not reading.groups:
        raise OptoValueError(
            f"no trajectory group could be exported from {run_dir}: {stats.summary()}; a group needs "
            "2+ scored rollouts of one example in one step with different rewards (validate candidates, "
            "or gather samples with opto collect --samples 4)"
        )
    if stats.off_policy_trajectories:
        logger.warning(
            "%d of %d trajectories carry no logprobs: they are off-policy text for ART, which trains "
            "on them only with allow_training_without_logprobs (in effect advantage-weighted SFT); "
            "record logprobs with complete(..., logprobs=True) for on-policy GRPO",
            stats.off_policy_trajectories,
            stats.trajectories,
        )
    train, validation = train_validation_split(reading.groups, validation_fraction, seed=seed)
    report = ExportReport(
        run_dir=str(run_dir),
        source="rollouts",
        format="art",
        out=str(out),
        records=writer.write(train, out),
        groups=stats,
    )
    if validation_fraction > 0:
        report.validation_out = str(validation_path(out))
        report.validation_records = writer.write(validation, validation_path(out))
    return report


def _nothing_exported(
    run_dir: str | Path,
    source: str,
    stats: BuilderStats,
    unused: dict[str, int],
    *,
    supervised: bool = False,
    min_score: float | None = None,
) -> str:
    hints = []
    if stats.turns == 0:
        hints.append("no scored turns were found")
    if unused:
        hints.append("unused: " + ", ".join(f"{count} {reason}" for reason, count in unused.items()))
    if source in ("optimizer", "all") and any(reason.startswith("optimizer") for reason in unused):
        hints.append("optimizer turns need AggregatedUpdate(..., score_proposals='instance') and num_proposals > 1")
    if stats.turns_skipped_single_candidate:
        share = (
            "every turn"
            if stats.turns_skipped_single_candidate == stats.turns
            else f"{stats.turns_skipped_single_candidate} of {stats.turns} turns"
        )
        hints.append(
            f"{share} had a single candidate: use Optimizer(num_proposals=2) or "
            "Aggregator(num_candidates=2)"
            + (
                ", or --min-score X (min_score=X) to export every complete reply scoring at least X"
                if supervised
                else ""
            )
        )
    if min_score is not None and stats.candidates_below_min_score:
        hints.append(f"{stats.candidates_below_min_score} complete replies scored below --min-score {min_score}")
    if stats.pairs_skipped_small_diff:
        hints.append(f"{stats.pairs_skipped_small_diff} candidate pairs tied or differed by less than --min-score-diff")
    if stats.pairs_skipped_truncated:
        hints.append(f"{stats.pairs_skipped_truncated} pairs would have chosen a reply cut at max_tokens")
    return f"no preference data could be exported from {run_dir} (source {source}): {stats.summary()}" + (
        "; " + "; ".join(hints) if hints else ""
    )
