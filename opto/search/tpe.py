"""Numeric and categorical knobs by Bayesian search: `TPEProposer`, over Optuna's TPE sampler.

An LLM guesses at a temperature or a top-k from feedback; a Tree-structured Parzen
Estimator learns from every score it is told where the good values lie. `TPEProposer`
is a proposer like any other: once a step it proposes values for the `int`, `float`,
`bool` and `Constraint(choices=...)` parameters it searches (numbers need
`Constraint(min=, max=)`), and the trainer tells it the validation score of every
candidate its proposal went into. Its candidates get the same cheap first look as an LLM's
(with a validation set, a greedy search screens each on the batch and races it on the
set): one stopped early is told as an Optuna *pruned* trial with its score where it was
stopped, which TPE ranks below every candidate scored on the whole set, so it learns
where not to look without paying for the whole set. So

    AggregatedUpdate(agent, [Optimizer(llm), TPEProposer()], validation=valset)

tunes text and numbers together. Its history (the values tried and their scores) is
saved in the checkpoint, and each draw depends only on the seed and that history, so a
resumed run proposes what the uninterrupted one would. Needs the `tpe` extra
(`pip install 'opto-agents[tpe]'`, i.e. Optuna).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from ..core.parameters import Parameter
from ..core.rollout import Rollout
from ..errors import MissingDependencyError, OptoTypeError, OptoValueError
from .proposers import Proposal

__all__ = ["TPEProposer"]

logger = logging.getLogger(__name__)


def _import_optuna() -> Any:
    try:
        import optuna
    except ImportError as exc:
        raise MissingDependencyError("TPEProposer needs Optuna: pip install 'opto-agents[tpe]'") from exc
    return optuna


class TPEProposer:
    """Proposes values for numeric and categorical parameters with Optuna's TPE sampler.

    Args:
        parameters: the names of the parameters to search (None: every trainable `bool`,
            every parameter with `Constraint(choices=...)`, and every `int` or `float` with
            `Constraint(min=, max=)`). A named parameter TPE cannot search is an error.
        seed: the sampler's seed.
        n_startup_trials: random draws before the model of good values takes over.
        name: labels its proposals in the ledger.

    It is asked once a step (not per instance), whatever `proposals=` says.
    """

    per_step = True

    def __init__(
        self, parameters: Sequence[str] | None = None, seed: int = 0, *, n_startup_trials: int = 5, name: str = "tpe"
    ) -> None:
        if isinstance(parameters, str):
            raise OptoTypeError(f"parameters takes a list of names, e.g. [{parameters!r}]")
        if n_startup_trials < 1:
            raise OptoValueError(f"n_startup_trials must be >= 1, got {n_startup_trials}")
        self.names = list(parameters) if parameters is not None else None
        self.seed = seed
        self.n_startup_trials = n_startup_trials
        self.name = name
        # {"params": {...}, "value": whole-set score | None, "partial": score where stopped | None}
        self._trials: list[dict[str, Any]] = []
        self._pending: dict[str, dict[str, Any]] = {}  # proposal id -> its values, until told

    # The Proposer protocol --------------------------------------------------------------

    async def propose(self, parameters: Sequence[Parameter], rollout: Rollout) -> list[Proposal]:
        return await self.propose_batch(parameters, [rollout])

    async def propose_batch(self, parameters: Sequence[Parameter], rollouts: Sequence[Rollout]) -> list[Proposal]:
        """One proposal: the next values the sampler wants to try."""
        space = self.space(parameters)
        if not space:
            return []
        trial = self._study(space).ask(space)
        values = {name: _plain(trial.params[name]) for name in space}
        proposal = Proposal(
            proposer=self.name,
            instance_id=rollouts[0].example_id if rollouts else "",
            instance_ids=[r.example_id for r in rollouts],
            update=values,
            extraction_method="tpe",
            reasoning=f"TPE draw {len(self._trials) + 1} after {self._scored('value')} scored and "
            f"{self._scored('partial')} stopped early: " + ", ".join(f"{k}={v!r}" for k, v in values.items()),
        )
        self._pending[proposal.proposal_id] = values
        return [proposal]

    def observe(self, proposal_id: str, score: float | None, partial: float | None = None) -> None:
        """The validation score of the candidate a proposal went into (None: not scored on
        the whole validation set); for one stopped before it (screened out on the batch,
        dropped in a race), `partial`, its score where it was stopped: a pruned trial."""
        values = self._pending.pop(proposal_id, None)
        if values is not None:
            self._trials.append({"params": values, "value": score, "partial": None if score is not None else partial})

    def state_dict(self) -> dict[str, Any]:
        return {"trials": [dict(t) for t in self._trials]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._trials = [dict(t) for t in state.get("trials", [])]
        self._pending = {}

    # The search space ---------------------------------------------------------------------

    def space(self, parameters: Sequence[Parameter]) -> dict[str, Any]:
        """{name: Optuna distribution} for the parameters this proposer searches."""
        optuna = _import_optuna()
        dists = optuna.distributions
        found: dict[str, Any] = {}
        named = {p.name: p for p in parameters if p.name is not None}
        for name in self.names or []:
            if name not in named:
                raise OptoValueError(f"TPEProposer: the agent has no parameter {name!r}; it has {sorted(named)}")
        for name, param in named.items():
            if not param.trainable or (self.names is not None and name not in self.names):
                continue
            constraint = param.constraint
            if constraint is not None and constraint.choices is not None:
                found[name] = dists.CategoricalDistribution(list(constraint.choices))
            elif param.type is bool:
                found[name] = dists.CategoricalDistribution([False, True])
            elif (
                param.type in (int, float)
                and constraint is not None
                and constraint.min is not None
                and constraint.max is not None
            ):
                kind = dists.IntDistribution if param.type is int else dists.FloatDistribution
                found[name] = kind(param.type(constraint.min), param.type(constraint.max))
            elif self.names is not None:
                raise OptoValueError(
                    f"TPEProposer cannot search {param.name!r} ({param.type.__name__}): give it "
                    "Constraint(min=..., max=...) (a number) or Constraint(choices=[...])"
                )
        return found

    def _scored(self, key: str) -> int:
        """How many trials have a `key` ("value": the whole set, "partial": stopped early)."""
        return sum(t.get(key) is not None for t in self._trials)

    def _study(self, space: dict[str, Any]) -> Any:
        """A study holding the history; its sampler is seeded by (seed, history length), so
        a draw depends only on them (a resumed run draws the same)."""
        optuna = _import_optuna()
        sampler = optuna.samplers.TPESampler(
            seed=self.seed * 100_003 + len(self._trials), n_startup_trials=self.n_startup_trials
        )
        verbosity = optuna.logging.get_verbosity()
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # not a line per step about a new study
        try:
            study = optuna.create_study(direction="maximize", sampler=sampler)
        finally:
            optuna.logging.set_verbosity(verbosity)
        for trial in self._trials:
            params = {k: v for k, v in trial["params"].items() if k in space}
            if not params or any(not space[k]._contains(space[k].to_internal_repr(v)) for k, v in params.items()):
                continue  # tried in another space (a changed constraint): not evidence here
            study.add_trial(_trial(optuna, params, {k: space[k] for k in params}, trial))
        return study


def _trial(optuna: Any, params: dict[str, Any], distributions: dict[str, Any], told: dict[str, Any]) -> Any:
    """A history entry as an Optuna trial: complete with its whole-set score; pruned with its
    score where it was stopped early (TPE ranks pruned trials below every complete one, and
    among themselves by that score); else failed (never scored: TPE leaves it out)."""
    states = optuna.trial.TrialState
    if told["value"] is not None:
        found: dict[str, Any] = {"value": told["value"], "state": states.COMPLETE}
    elif told.get("partial") is not None:  # a checkpoint from before screening has no "partial"
        found = {"intermediate_values": {0: told["partial"]}, "state": states.PRUNED}
    else:
        found = {"state": states.FAIL}
    return optuna.trial.create_trial(params=params, distributions=distributions, **found)


def _plain(value: Any) -> Any:
    """Numpy scalars from the sampler as plain Python values (they must survive JSON)."""
    return value.item() if hasattr(value, "item") else value
