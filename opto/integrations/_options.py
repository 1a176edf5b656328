"""The options an integration passes on to opto's trainer."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Mapping
from typing import Any

from ..errors import OptoValueError
from ..search.final_check import FinalCheck
from ..search.stopping import MaxMetricCalls, StopCondition
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


#: Below this many metric calls the final check keeps none for itself (see `budgeted_final_check`).
SMALL_BUDGET = 60


def budgeted_final_check(metric_calls: int) -> FinalCheck:
    """opto's final check in proportion with a metric-call budget (GEPA's and DSPy's
    `max_metric_calls`): the noise probe and the check's re-run take about a tenth and a
    fifth of it, so a budget is left mostly for the search, as GEPA spends it. Below
    `SMALL_BUDGET` calls (GEPA's examples use 10 to 50) even that would leave the search
    too little: no probe, nothing kept, and the check reads what the search measured of
    the start and the final values (a deterministic metric gives the same scores again),
    held to the reused-evidence level."""
    if metric_calls < SMALL_BUDGET:  # nothing held out either: held-out examples would cost calls
        return FinalCheck(probe=0, keep_calls=False, min_data=sys.maxsize)
    probe = max(2, min(12, metric_calls // 20))
    return FinalCheck(probe=probe, rerun_size=max(4, metric_calls // 10), power_size=0)


#: Why a tracking argument of GEPA's or DSPy's has no equivalent here.
TRACKING = "opto tracks through a callback: callbacks=[MLflowCallback(...)] (opto.report.tracking)"


def refuse_unmapped(given: Mapping[str, Any], table: Mapping[str, tuple[tuple[Any, ...], str]], caller: str) -> None:
    """One error naming every argument in `given` that `table` ({name: (accepted values,
    why)}) lists as having no equivalent, at a value other than those accepted."""
    refused = [
        f"{name}={given[name]!r}: {why}"
        for name, (accepted, why) in table.items()
        if name in given and not any(given[name] is ok or _plain_equal(given[name], ok) for ok in accepted)
    ]
    if refused:
        raise OptoValueError(f"{caller} has no equivalent for " + "; ".join(refused))


def _plain_equal(value: Any, accepted: Any) -> bool:
    return isinstance(value, (str, bool, int, float)) and type(value) is type(accepted) and value == accepted


#: A merge every this many steps when GEPA's or DSPy's `use_merge=True` (GEPA schedules its own).
MERGE_EVERY = 3


def apply_gepa_search(
    trainer: dict[str, Any],
    train: dict[str, Any],
    *,
    n_train: int,
    components: Any = None,
    use_merge: bool = False,
    minibatch: int | None = None,
    metric_calls: int | None = None,
) -> None:
    """GEPA's search settings (shared by `gepa.optimize` and `dspy.GEPA`) as opto's options:
    the components each step updates, merges, the reflection's minibatch, and a metric-call
    budget (a stop, a final check in proportion, and epochs enough to spend it)."""
    if components is not None:
        if components not in ("round_robin", "all"):
            raise OptoValueError(f"the component selector must be 'round_robin' or 'all', got {components!r}")
        trainer.setdefault("components", components)
    if use_merge:
        if trainer.setdefault("selection", "pareto") != "pareto":
            raise OptoValueError("use_merge=True merges lineages of a candidate pool: it needs pareto selection")
        trainer.setdefault("merge_every", MERGE_EVERY)
    if minibatch is not None:
        train.setdefault("batch_size", int(minibatch))
    train.setdefault("batch_size", 3)  # GEPA's reflection minibatch
    if metric_calls is not None:
        stop: StopCondition = MaxMetricCalls(metric_calls)
        train["stop"] = train["stop"] | stop if train.get("stop") is not None else stop
        trainer.setdefault("final_check", budgeted_final_check(metric_calls))
        # Until the metric calls are spent, as GEPA runs: epochs enough for every call to be a step's.
        train.setdefault("num_epochs", max(1, -(-metric_calls // max(1, n_train))))
