"""What a run will cost before it starts: model calls, tokens and dollars, by role.

`Minibatch.estimate(guide, train_dataset, **train_options)` counts the calls the run's
settings imply (steps x each step's calls, plus the test evaluations) and prices them with
the tokens of a few real calls: the agent (and guide) on a small sample of the training
data, one proposal, one aggregation. `tokens=` gives those figures instead, and then no
call is made. Dollars come from each model's price (`prices=`, else genai-prices' table);
a model that runs on this machine costs nothing; a remote model with no known price makes
the dollars unknown (None), and the estimate says which.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

from pydantic import BaseModel, Field

from ..errors import OptoError, OptoValueError
from ..llm.base import Model
from ..llm.usage import Budget, UsageStats, estimate_tokens

__all__ = ["Estimate", "RoleEstimate", "RunNotConfirmed", "ask_on_terminal", "ask_to_confirm", "assumed_tokens"]

#: The reply of one agent call assumed by an estimate that makes no call, in tokens.
ASSUMED_AGENT_REPLY = 150

#: The parts of a run an estimate is broken into.
ROLES = ("agent", "optimizer", "aggregator", "validation", "check", "test")


class RunNotConfirmed(OptoError):
    """`train(confirm=...)` was answered no: nothing more was sent."""


class RoleEstimate(BaseModel):
    """One role's share of a run. `usd` is None when a model it calls has no known price."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usd: float | None = 0.0


class Estimate(BaseModel):
    """What a run is expected to spend, in total and per role (see `ROLES`), with the
    assumptions behind it, the budgets it would exceed, and what measuring it cost.
    The calls depend on what the run finds: `calls_at_fewest` (every batch went right,
    so nothing was proposed, validated or checked) and `calls_at_most` (every proposal a
    candidate, a noisy agent measuring winners and the check's every round again, a
    fallback checked) bound them; `calls_if_nothing_accepted` is the estimate less the
    final check, which makes no call when the search ends where it started."""

    steps: int
    calls: int
    prompt_tokens: int
    completion_tokens: int
    usd: float | None
    by_role: dict[str, RoleEstimate]
    assumptions: list[str] = Field(default_factory=list)
    over_budget: list[str] = Field(default_factory=list)
    spent: UsageStats = Field(default_factory=UsageStats)
    # The calls as a range: the run's cost depends on what it finds (see the assumptions).
    calls_at_fewest: int | None = None
    calls_if_nothing_accepted: int | None = None
    calls_at_most: int | None = None

    def __str__(self) -> str:
        lines = [
            f"Estimated cost of {self.steps} steps:",
            f"  {'role':<11}{'calls':>8}{'prompt tokens':>15}{'completion tokens':>19}{'dollars':>11}",
        ]
        rows = [(role, r) for role, r in self.by_role.items() if r.calls]
        total = RoleEstimate(calls=self.calls, prompt_tokens=self.prompt_tokens,
                             completion_tokens=self.completion_tokens, usd=self.usd)  # fmt: skip
        for role, r in [*rows, ("total", total)]:
            usd = "unknown" if r.usd is None else f"${r.usd:,.4f}"
            lines.append(f"  {role:<11}{r.calls:>8,}{r.prompt_tokens:>15,}{r.completion_tokens:>19,}{usd:>11}")
        if None not in (self.calls_at_fewest, self.calls_if_nothing_accepted, self.calls_at_most):
            lines.append(
                f"  calls: at the fewest {self.calls_at_fewest:,} (every batch right: nothing to propose), "
                f"{self.calls_if_nothing_accepted:,} if nothing is accepted, {self.calls:,} as estimated, at most "
                f"{self.calls_at_most:,}"
            )
        lines += [f"  - {a}" for a in self.assumptions]
        lines += [f"  ! {b}" for b in self.over_budget]
        if self.spent.calls:
            lines.append(
                f"  Measuring this estimate cost {self.spent.calls} calls, {self.spent.total_tokens:,} tokens, "
                f"${self.spent.cost_usd:,.4f}."
            )
        return "\n".join(lines)


class PerCall(BaseModel):
    """Measured (or given) figures of one unit of work: a rollout, a proposal call, an
    aggregation call."""

    calls: float = 1.0
    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0
    usd: float | None = 0.0

    def times(self, n: int) -> RoleEstimate:
        return RoleEstimate(
            calls=round(n * self.calls),
            prompt_tokens=round(n * self.prompt_tokens),
            completion_tokens=round(n * self.completion_tokens),
            usd=None if self.usd is None else n * self.usd,
        )


def per_unit(by_model: Mapping[str, UsageStats], units: int, models: Sequence[Model]) -> PerCall:
    """The average of `units` units of work from what a meter counted; dollars None when a
    remote model without a known price was called."""
    total = sum(by_model.values(), UsageStats())
    named = {m.name: m for m in models}
    unpriced = [
        name for name, used in by_model.items()
        if used.total_tokens and (m := named.get(name)) is not None and m.price is None and not m.local
    ]  # fmt: skip
    n = max(units, 1)
    return PerCall(
        calls=total.calls / n,
        prompt_tokens=total.prompt_tokens / n,
        completion_tokens=total.completion_tokens / n,
        usd=None if unpriced else total.cost_usd / n,
    )


def given_per_call(tokens: Mapping[str, Any], role: str, model: Model | None) -> PerCall | None:
    """`tokens[role]` = (prompt, completion) tokens per call, priced with `model`'s price."""
    if role not in tokens:
        return None
    figures = tokens[role]
    if not (isinstance(figures, Sequence) and len(figures) == 2 and all(isinstance(t, int) and t >= 0
                                                                         for t in figures)):  # fmt: skip
        raise OptoValueError(
            f"tokens[{role!r}] must be (prompt_tokens, completion_tokens) per call, two ints >= 0, got {figures!r}"
        )
    prompt, completion = figures
    usd: float | None = 0.0
    price = model.price if model is not None else None
    if price is not None:  # a price given (prices=) or known bills even a stand-in model
        usd = (prompt * price.input + completion * price.output) / 1_000_000
    elif model is not None and not model.local:
        usd = None
    return PerCall(prompt_tokens=prompt, completion_tokens=completion, usd=usd)


def assumed_tokens(
    values: Sequence[Any], inputs: Sequence[Any], batch_size: int
) -> tuple[dict[str, tuple[int, int]], str]:
    """(prompt, completion) tokens per call by role, from the text alone (no call): an agent
    call holds the trainable `values` and an input and replies with `ASSUMED_AGENT_REPLY`
    tokens; a reflective call shows the values and a batch of such runs and rewrites the
    values (its "auto" reply limit); an aggregation shows the values a few times over.
    Returns the figures and the assumption, said in words."""
    value_tokens = sum(estimate_tokens(str(v)) for v in values)
    input_tokens = max((estimate_tokens(json.dumps(x, default=str)) for x in inputs), default=0)
    agent = value_tokens + input_tokens + 20
    rewrite = min(2048, 256 + 2 * value_tokens)
    tokens = {
        "agent": (agent, ASSUMED_AGENT_REPLY),
        "optimizer": (700 + value_tokens + batch_size * (agent + ASSUMED_AGENT_REPLY + 60), rewrite),
        "aggregator": (500 + 3 * value_tokens, rewrite),
    }
    said = (
        f"no call was made: tokens assumed from the text, {agent} prompt tokens an agent call (its trainable values "
        f"and the longest input) and {ASSUMED_AGENT_REPLY} for its reply; estimate() measures them with a few calls"
    )
    return tokens, said


def evaluations(steps: int, eval_frequency: int | None) -> int:
    """Test evaluations of a run: at the start, every `eval_frequency` steps, at the end."""
    periodic = steps // eval_frequency if eval_frequency else 0
    ends_on_one = bool(eval_frequency) and steps > 0 and steps % eval_frequency == 0  # type: ignore[operator]
    return 1 + periodic + (0 if ends_on_one else 1)


def combine(steps: int, by_role: dict[str, RoleEstimate], assumptions: list[str], budgets: list[tuple[str, Budget]],
            spent: UsageStats) -> Estimate:  # fmt: skip
    """The totals, and the budgets they would exceed."""
    roles = {role: by_role.get(role, RoleEstimate()) for role in ROLES}
    usds = [r.usd for r in roles.values() if r.calls]
    estimate = Estimate(
        steps=steps,
        calls=sum(r.calls for r in roles.values()),
        prompt_tokens=sum(r.prompt_tokens for r in roles.values()),
        completion_tokens=sum(r.completion_tokens for r in roles.values()),
        usd=None if any(u is None for u in usds) else sum(u for u in usds if u is not None),
        by_role=roles,
        assumptions=assumptions,
        spent=spent,
    )
    for whose, budget in budgets:
        left = budget.remaining()
        tokens = estimate.prompt_tokens + estimate.completion_tokens
        for what, need, have in (
            ("calls", estimate.calls, left["calls"]),
            ("tokens", tokens, left["tokens"]),
            ("dollars", estimate.usd, left["cost_usd"]),
        ):
            if have is not None and need is not None and need > have:
                figure = f"${need:,.4f}" if what == "dollars" else f"{need:,}"
                estimate.over_budget.append(
                    f"the budget of {whose} has {have:,} {what} left; the run is estimated at {figure}: it will stop "
                    "early (stopped_reason says where), unless the budget is raised"
                )
    return estimate


def steps_of(examples: int, batch_size: int, num_epochs: int) -> int:
    return num_epochs * math.ceil(examples / batch_size) if examples else 0


def ask_on_terminal(
    estimate: Estimate,
    *,
    stream: TextIO | None = None,
    to_skip: str = "pass confirm=<a function of the Estimate that returns True to go on> (or confirm=False)",
) -> bool:
    """Print `estimate` on `stream` (stdout) and ask on the terminal; refuse without one."""
    out = stream or sys.stdout
    print(estimate, file=out, flush=True)
    if not sys.stdin.isatty():
        raise RunNotConfirmed(f"the run asks before it starts, and stdin is not a terminal: {to_skip}")
    print("Start the run? [y/N] ", end="", file=out, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def ask_to_confirm(estimate: Estimate, confirm: bool | Callable[[Estimate], bool]) -> None:
    """Ask `confirm` (a function of `estimate`, or True: `ask_on_terminal`); raise
    `RunNotConfirmed` on a no."""
    agreed = bool(confirm(estimate)) if callable(confirm) else ask_on_terminal(estimate)
    if not agreed:
        raise RunNotConfirmed(
            f"the run was not started (estimated {estimate.calls:,} calls, "
            + ("unknown dollars" if estimate.usd is None else f"${estimate.usd:,.4f}")
            + "): nothing more was sent"
        )
