"""Why a run learned nothing: the best rejected win, what the rule needed, what would change it.

A run that accepts nothing looks the same whether its proposals were useless or its rule
could not see their gain. The difference is in the decisions: a rejected candidate that
scored above the current values was held back by the rule (a paired test, a threshold,
failures, the validation set), and each of those has an option that changes it. The
trainer keeps the best such decision in its checkpoint; `opto report` finds it in the
ledger. Both explain it with `explain`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["best_rejected_win", "explain", "is_rejected_win", "summarize"]


def is_rejected_win(decision: Mapping[str, Any]) -> bool:
    """A rejected candidate that scored above the current values where it was judged."""
    candidate, current = decision.get("candidate_score"), decision.get("current_score")
    return decision.get("accepted") is False and candidate is not None and current is not None and candidate > current


def best_rejected_win(
    decisions: Iterable[Mapping[str, Any]], best: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """The rejected win with the largest margin over the current values (`best` so far included)."""
    found = dict(best) if best is not None else None
    for decision in decisions:
        if is_rejected_win(decision) and (found is None or _margin(decision) > _margin(found)):
            found = dict(decision)
    return found


def explain(decision: Mapping[str, Any]) -> str:
    """One rejected win in words: the scores, what the rule needed and the option that changes it."""
    step = decision.get("step")
    wins, losses = decision.get("wins"), decision.get("losses")
    where = "on its batch" if decision.get("validation") == "minibatch" else "where it was validated"
    tally = (
        f" ({wins} example{'s' if wins != 1 else ''} won, {losses} lost)"
        if wins is not None and losses is not None
        else ""
    )
    said = (
        f"{'step ' + str(step) + ': ' if step is not None else ''}candidate {decision.get('candidate_id')} scored "
        f"{decision['candidate_score']:.3f} against the current {decision['current_score']:.3f} {where}{tally}"
    )
    return f"{said}, but {_needed(decision)}"


def _needed(decision: Mapping[str, Any]) -> str:
    """What the rule needed that the candidate did not show, and the option that changes it."""
    reason = str(decision.get("reason", ""))
    alpha, p_value = decision.get("alpha"), decision.get("p_value")
    if "not the step's choice" in reason:
        return "another candidate of the same step scored higher and was the one tested"
    if "failed on" in reason:
        return (
            "it made more examples fail (the agent or guide raised) than the current values: see the rollouts' "
            "errors in the ledger"
        )
    if alpha is not None and p_value is not None and p_value > alpha:
        sweep = math.ceil(math.log2(1 / alpha))
        return (
            f"the paired test needed p <= {alpha:g} and got p = {p_value:.3g}; with 0/1 scores a win passes it "
            f"only with at least {sweep} examples won and none lost. To accept such wins: a larger batch_size, "
            "a validation set (validation=<dataset>, or 32 or more training examples for the automatic split), "
            f"or a looser test (validation=MinibatchValidation(alpha=...): this win needed a level of {p_value:.3g}, "
            "times the number of candidates a step tests on its batch)"
        )
    if decision.get("stage") == "race":
        return "it fell behind on the validation set part-way (a race): the batch's win did not hold up there"
    if " <= " in reason.split(";")[0]:  # above the current score, not above it + the threshold
        return "it did not clear improvement_threshold: lower it to accept smaller gains"
    return f"the rule rejected it: {reason}"


def summarize(
    *, steps: int, accepted: int, no_update: int, rejected_wins: int, best: Mapping[str, Any] | None
) -> str | None:
    """The run's diagnosis: None when it accepted something and rejected no win."""
    if steps == 0 or (accepted and not rejected_wins):
        return None
    lines = []
    if not accepted:
        lines.append(f"No candidate was accepted in {steps} step{'s' if steps != 1 else ''}.")
    if best is not None:
        count = f"{rejected_wins} rejected candidate{'s' if rejected_wins != 1 else ''} scored above the current values"
        lines.append(f"{count}; the best: {explain(best)}.")
    elif not accepted:
        lines.append(
            "No candidate scored above the current values where it was validated: the proposals did not help"
            + (f", and {no_update} step(s) had no candidate at all" if no_update else "")
            + ". Look at what the optimizer was shown and proposed (train(verbose=True), or the ledger's "
            "proposal records), and check that the agent reads its parameters."
        )
    return " ".join(lines)


def _margin(decision: Mapping[str, Any]) -> tuple[float, float]:
    """Larger score gain first; then the smaller p-value."""
    gain = decision["candidate_score"] - decision["current_score"]
    p_value = decision.get("p_value")
    return gain, -(p_value if p_value is not None else 1.0)
