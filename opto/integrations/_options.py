"""The options an integration passes on to opto's trainer."""

from __future__ import annotations

import inspect
from typing import Any

from ..errors import OptoValueError
from ..search.final_check import FinalCheck
from ..trainer.aggregated import AggregatedUpdate


def split_options(options: dict[str, Any], caller: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """`options` into `AggregatedUpdate`'s keywords and `train()`'s; an unknown one is refused."""
    trainer = set(inspect.signature(AggregatedUpdate.__init__).parameters) - {"self", "agent", "optimizer"}
    train = set(inspect.signature(AggregatedUpdate.train).parameters) - {"self", "guide", "train_dataset"}
    unknown = sorted(set(options) - trainer - train)
    if unknown:
        raise OptoValueError(
            f"{caller} has no option {', '.join(unknown)}: it takes AggregatedUpdate's ({', '.join(sorted(trainer))}) "
            f"and train()'s ({', '.join(sorted(train))})"
        )
    return {k: v for k, v in options.items() if k in trainer}, {k: v for k, v in options.items() if k in train}


def budgeted_final_check(metric_calls: int) -> FinalCheck:
    """opto's final check in proportion with a metric-call budget (GEPA's and DSPy's
    `max_metric_calls`): the noise probe and the check's re-run take about a tenth and a
    fifth of it, so a small budget is left mostly for the search, as GEPA spends it."""
    probe = max(2, min(12, metric_calls // 20))
    return FinalCheck(probe=probe, rerun_size=max(4, metric_calls // 10))
