"""`Costing`: a run's cost estimate put together from its trainer's settings.

The trainer says what one step calls (`calls_per_step`), what the final check and the
noise probe take (`check_rollouts`, `check_calls`) and what a unit of work costs in
tokens (`_measure_units`); `Costing` counts the steps, prices every role, writes the
assumptions and bounds the calls by the run's outcome. `Minibatch.aestimate` checks the
options and hands over to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from ..core.agent import Agent
from ..core.data import DataLoader, Example
from ..core.guides import Guide
from ..core.rollout import Rollout
from ..errors import OptoValueError
from ..llm.usage import Budget, meter_usage
from .estimate import Estimate, PerCall, RoleEstimate, assumed_tokens, combine, evaluations, steps_of

__all__ = ["Costed", "Costing"]


class Costed(Protocol):
    """What `Costing` asks of a trainer."""

    agent: Agent

    def calls_per_step(self, batch_size: int, most: bool = False) -> dict[str, int]: ...
    def logged_screen_size(self, batch_size: int) -> int: ...
    def check_rollouts(self) -> int: ...
    def check_calls(self, most: bool = False) -> int: ...
    def budget_users(self) -> list[tuple[str, Budget, set[str]]]: ...
    def _validation_assumption(self, steps: int) -> str: ...
    async def _measure_units(
        self, guide: Guide, sample: list[Example], given: dict[str, Any], options: dict[str, Any]
    ) -> tuple[dict[str, PerCall], list[str], list[Rollout]]: ...


class Costing:
    """The estimate of one `train` call of `trainer` (see `Minibatch.aestimate`)."""

    def __init__(self, trainer: Costed) -> None:
        self.trainer = trainer

    async def estimate(
        self,
        guide: Guide,
        loader: DataLoader,
        test: list[Example],
        options: Mapping[str, Any],
        *,
        sample: int,
        tokens: Mapping[str, tuple[int, int]] | None,
        measure: bool,
    ) -> Estimate:
        """Calls by role counted from the settings, priced with the tokens of `sample`
        examples' work (or `tokens`, or assumed from the text when not `measure`d)."""
        batch_size, num_epochs = options["batch_size"], options["num_epochs"]
        n, logged = len(loader.dataset), len(options["logged"] or [])
        steps = steps_of(n, batch_size, num_epochs) + (1 if logged else 0)
        counts, most = (self.step_calls(n, batch_size, num_epochs, logged, m) for m in (False, True))
        given = _given_tokens(tokens)
        first = _first_examples(loader, sample)
        assumed = None
        if not measure:
            values = [p.value for p in self.trainer.agent.parameters(trainable_only=True)]
            figures, assumed = assumed_tokens(values, [e.x for e in first], batch_size)
            given = {**figures, **given}
        with meter_usage() as meter:
            units, assumptions, _ = await self.trainer._measure_units(guide, first, dict(given), dict(options))
        evals = evaluations(steps, options["eval_frequency"]) if test else 0
        by_role = self.roles(units, counts, evals * len(test))
        assumptions.insert(
            0,
            f"{steps} steps: {num_epochs} epochs of {n} training examples in batches of {batch_size}"
            + (f"; {evals} test evaluations of {len(test)} examples" if test else ""),
        )
        if logged:
            assumptions.append(
                f"a logged first step on {logged} records: the guide judges each (counted as a rollout) and "
                f"each candidate runs on up to {self.trainer.logged_screen_size(batch_size)} of them"
            )
        assumptions.append(self.trainer._validation_assumption(steps))
        if assumed is not None:
            assumptions.insert(0, assumed)
        low, high = self.outcomes(units["agent"], by_role, most, assumptions)
        budgets = [("train(budget=...)", options["budget"])] if options["budget"] is not None else []
        budgets += [(whose, budget) for whose, budget, _ in self.trainer.budget_users()]
        estimate = combine(steps, by_role, assumptions, budgets, meter.total)
        estimate.calls_if_nothing_accepted = sum(r.calls for r in low.values())
        estimate.calls_at_most = sum(r.calls for r in high.values())
        # At the fewest every batch went right: nothing to propose, validate or check.
        estimate.calls_at_fewest = sum(low[role].calls for role in ("agent", "check", "test"))
        return estimate

    def step_calls(self, n: int, batch_size: int, num_epochs: int, logged: int, most: bool) -> dict[str, int]:
        """The calls of every step of a run, by what makes them (`calls_per_step` summed);
        a logged first step judges each record and screens candidates on some of them."""
        counts: dict[str, int] = {}
        per_step = self.trainer.calls_per_step
        for size in [batch_size] * (n // batch_size) + ([n % batch_size] if n % batch_size else []):
            for what, calls in per_step(size, most).items():
                counts[what] = counts.get(what, 0) + num_epochs * calls
        if logged:
            screen = per_step(min(logged, self.trainer.logged_screen_size(batch_size)), most)
            for what, calls in per_step(logged, most).items():
                counts[what] = counts.get(what, 0) + (screen[what] if what == "validation" else calls)
        return counts

    def roles(self, units: dict[str, PerCall], counts: dict[str, int], tests: int) -> dict[str, RoleEstimate]:
        """Each role's calls, tokens and dollars: its count times its unit."""
        agent = units["agent"]
        by_role = {
            "agent": agent.times(counts.get("rollouts", 0)),
            "validation": agent.times(counts.get("validation", 0)),
            "check": agent.times(self.trainer.check_rollouts()),
            "test": agent.times(tests),
        }
        for role, what in (("optimizer", "proposals"), ("aggregator", "aggregation")):
            if counts.get(what) and role in units:
                by_role[role] = units[role].times(counts[what])
        return by_role

    def outcomes(
        self, agent: PerCall, by_role: dict[str, RoleEstimate], most: dict[str, int], assumptions: list[str]
    ) -> tuple[dict[str, RoleEstimate], dict[str, RoleEstimate]]:
        """The roles if nothing is accepted (the check makes no call) and at the most (a noisy
        agent measures winners and the check's every round again, a fallback is checked);
        the assumption that says which part depends on the outcome."""
        check, first_look = self.trainer.check_rollouts(), self.trainer.check_calls()
        probe = agent.times(check - first_look)
        low = {**by_role, "check": probe}
        high = {
            **by_role,
            "validation": agent.times(most.get("validation", 0)),
            "check": agent.times(check - first_look + self.trainer.check_calls(most=True)),
        }
        assumptions.append(
            f"what depends on the outcome: the final check ({by_role['check'].calls - probe.calls:,} calls when the "
            f"search moved, none when nothing was accepted, up to {high['check'].calls - probe.calls:,} when the "
            "agent is noisy and a fallback is checked too) and the validation of a noisy agent's winners (up to "
            f"{high['validation'].calls:,} calls)"
        )
        return low, high


def _given_tokens(tokens: Mapping[str, tuple[int, int]] | None) -> dict[str, Any]:
    given = dict(tokens or {})
    unknown = set(given) - {"agent", "optimizer", "aggregator"}
    if unknown:
        raise OptoValueError(
            f"tokens has no role {sorted(unknown)}: give (prompt, completion) tokens per call for "
            "'agent' (a rollout), 'optimizer' (a proposal call) or 'aggregator'"
        )
    return given


def _first_examples(loader: DataLoader, sample: int) -> list[Example]:
    """The first `sample` examples the run will train on."""
    first: list[Example] = []
    for batch in loader:
        first += batch[: sample - len(first)]
        if len(first) == sample:
            break
    return first
