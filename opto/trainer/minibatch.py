"""`Minibatch`: the generic training loop (batches, epochs, evaluation, checkpoints)."""

from __future__ import annotations

import inspect
import logging
import time
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from .._util.async_tools import run_sync
from .._util.files import atomic_write_json
from ..core.agent import Agent
from ..core.data import DataLoader, Example, load_dataset
from ..core.guides import Guide, check_examples
from ..core.logged import LoggedRollout, logged_examples
from ..core.rollout import Rollout
from ..errors import OptoTypeError, OptoValueError
from ..executors.local import AsyncioExecutor, RolloutExecutor
from ..llm.base import Model
from ..llm.usage import Budget, UsageStats, meter_usage
from ..run.callbacks import Callback, CallbackList
from ..run.events import RolloutEvent, StepRecord
from ..run.ledger import Checkpoint, RunDir, RunDirWriter
from ..run.results import EvalResult, FinalCheckResult, TrainResult
from ..search.stopping import StopCondition
from .context import StepContext
from .costing import Costing
from .diagnosis import best_rejected_win, is_rejected_win, summarize
from .estimate import Estimate, PerCall, ask_to_confirm, given_per_call, per_unit
from .evaluation import aevaluate
from .failures import DEFAULT_MAX_FAILURES, TooManyFailures, validate_max_failures
from .final_check import not_run
from .options import check_flag, check_int, check_number
from .resume import open_run
from .session import Session, TrainOptions, fmt

__all__ = ["Minibatch", "StepContext", "StepOutcome"]

logger = logging.getLogger(__name__)


class StepOutcome(BaseModel):
    """What the Trace-compatible `update()` returns: the batch score under the current
    values and the decision (a step in `train()` gives the fuller `StepRecord`).

    `accepted` is None when no candidate update was made (nothing proposed, no change
    asked for, or nothing usable in the aggregator's reply).
    """

    score: float | None = None
    accepted: bool | None = None
    candidate_score: float | None = None
    update: dict[str, Any] = Field(default_factory=dict)
    note: str = ""


class Minibatch:
    """The training loop; subclasses define `step(batch, ctx) -> StepRecord`.

    Args:
        agent: the agent whose parameters are trained.
        concurrency: agent runs (and LLM calls the trainer starts) at once.
        executor: where rollouts run (default: `AsyncioExecutor(concurrency)` in this process).
    """

    #: Whether `train(logged=...)` can make logged rollouts its first step's evidence.
    takes_logged = False

    def __init__(self, agent: Agent, *, concurrency: int = 16, executor: RolloutExecutor | None = None) -> None:
        if not isinstance(agent, Agent):
            raise OptoTypeError(f"agent must be an opto Agent (subclass it or use @agent), got {type(agent).__name__}")
        if concurrency < 1:
            raise OptoValueError(f"concurrency must be >= 1, got {concurrency}")
        self.agent = agent
        self.concurrency = concurrency
        self.executor: RolloutExecutor = executor or AsyncioExecutor(concurrency)
        self._progress = False
        # Settings a subclass adds to the run's config, which a resumed run must share.
        self.extra_config: dict[str, Any] = {}
        if not agent.parameters(trainable_only=True):
            raise OptoValueError(f"{type(agent).__name__} has no trainable Parameter: nothing to optimize")

    async def step(self, batch: list[Example], ctx: StepContext) -> StepRecord:
        """One step on `batch`: fill and return `ctx.step_record`."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """What the trainer keeps between steps, saved in the checkpoint (JSON values)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()` on resume (called with {} for a new run)."""

    def finish(self) -> bool:
        """Called once the last step is done; True if it changed the stored values."""
        return False

    def validation_examples(self) -> list[Example]:
        """The examples candidates are validated on, apart from the training batches (none here)."""
        return []

    async def check_final(
        self, ctx: StepContext, start: dict[str, Any], final: dict[str, Any], fallback: dict[str, Any] | None
    ) -> tuple[FinalCheckResult, dict[str, Any]] | None:
        """Check the values the run ends with against `start` on evidence no decision used,
        and return the result with the values to return (None: this trainer has no check)."""
        return None

    async def _final_check_phase(self, state: Checkpoint, ctx: StepContext) -> bool:
        """Run `check_final` and apply the values it returns; True if they differ from the
        search's. A resumed run that made no step since its check returns what it did."""
        final = self.agent.stored_values()
        done = state.final_check
        if done is not None and done.get("step") == state.step and done.get("search_parameters") == final:
            found: tuple[FinalCheckResult, dict[str, Any]] | None = (
                FinalCheckResult.model_validate(done),
                {**final, **done.get("parameters", {})},
            )
        else:
            best = (state.best or {}).get("parameters")
            fallback = {**final, **best} if best else None
            if fallback in (final, state.initial_parameters):
                fallback = None
            # A budget that runs out here stops the run (the session says why): the
            # checkpoint keeps the search's values, and resume=True finishes the check.
            found = await self.check_final(ctx, dict(state.initial_parameters), final, fallback)
        if found is None:
            return False
        result, values = found
        result = result.model_copy(update={"parameters": values, "step": state.step})
        if done is None or result != FinalCheckResult.model_validate(done):
            changed_nothing = result.returned == "final" or final == state.initial_parameters
            (logger.info if changed_nothing else logger.warning)("%s", result.summary())
        state.final_check = result.model_dump(mode="json")
        if values == final:
            return False
        self.agent.apply(values)
        return True

    def _not_checked(self, state: Checkpoint, stopped: str | None) -> FinalCheckResult | None:
        """A run that stopped before its final check returns the start (the search's values
        stay in the checkpoint: resume=True finishes the run and checks them)."""
        if state.final_check is not None or not state.initial_parameters:
            return None
        final = self.agent.stored_values()
        if not self.has_final_check() or final == state.initial_parameters:
            return None
        self.agent.apply(state.initial_parameters)
        reason = f"the run stopped before it ({stopped or 'interrupted'}); resume=True finishes the run and checks"
        return not_run(reason, final)

    def has_final_check(self) -> bool:
        """Whether `check_final` checks anything (False here)."""
        return False

    def check_rollouts(self) -> int:
        """The rollouts a run makes outside its steps to check what it returns (none here)."""
        return 0

    def probe_rollouts(self) -> int:
        """The rollouts the run still makes before its first step to learn whether the
        agent or judge is noisy (none here)."""
        return 0

    def check_set(self) -> list[Example]:
        """The examples set apart for the final check (none here)."""
        return []

    def reserved_calls(self) -> int:
        """Calls `check_final` is expected to make at the fewest (none here), which stop
        conditions on calls count as spent."""
        return 0

    def calls_per_step(self, batch_size: int, most: bool = False) -> dict[str, int]:
        """The fewest model calls one step makes (`most`: the most), by what makes them (one
        call per rollout assumed), for the budget check and the estimate. Keys of agent
        runs: "rollouts", "validation"."""
        return {"rollouts": batch_size}

    def rollouts_to_accept(self, batch_size: int) -> int:
        """The fewest rollouts the run makes before it can accept its first candidate (the
        noise probe, the batch, and validating one candidate that wins)."""
        return batch_size

    def check_calls(self, most: bool = False) -> int:
        """The final check's calls: its first look when the search moved (`most`: a noisy
        agent's every round, and a fallback candidate); none when nothing was accepted."""
        return 0

    def logged_screen_size(self, batch_size: int) -> int:
        """How many logged inputs a logged first step screens its candidates on, at most."""
        return batch_size

    def budget_users(self) -> list[tuple[str, Budget, set[str]]]:
        """(whose, budget, which parts of a step it pays for) for each model budget of the run."""
        agent_parts = {"the initial test evaluation", "the noise probe", "rollouts", "validation"}
        return [
            (f"the agent's model {model.name!r}", model.budget, agent_parts)
            for model in models_in(self.agent)
            if model.budget is not None
        ]

    def check_budgets(self, budget: Budget | None, batch_size: int, test: list[Example] | None) -> None:
        """Refuse, before any call, a budget whose calls left cannot pay for one step."""
        need = {"the noise probe": self.probe_rollouts(), **self.calls_per_step(batch_size)}
        if test:
            need = {"the initial test evaluation": len(test), **need}
        users: dict[int, tuple[list[str], Budget, set[str]]] = {}
        run_budget = [("train(budget=...)", budget, set(need))] if budget is not None else []
        for whose, found, parts in [*run_budget, *self.budget_users()]:
            names, _, paid = users.setdefault(id(found), ([], found, set()))
            names.append(whose)
            paid.update(parts)
        for names, found, paid in users.values():
            left = found.remaining()["calls"]
            needed = {what: n for what, n in need.items() if what in paid and n}
            if left is not None and left < sum(needed.values()):
                listed = ", ".join(f"{n} for {what}" for what, n in needed.items())
                raise OptoValueError(
                    f"the budget of {' and '.join(names)} has {left} calls left, and the run needs at least "
                    f"{sum(needed.values())} of them before its first step can end ({listed}; one model call per "
                    "rollout assumed): raise its max_calls, or make a step smaller (batch_size, num_candidates, a "
                    "smaller validation set)"
                )

    def estimate(
        self,
        guide: Guide,
        train_dataset: Any,
        *,
        sample: int = 2,
        tokens: Mapping[str, tuple[int, int]] | None = None,
        measure: bool = True,
        **train_options: Any,
    ) -> Estimate:
        """`aestimate` from synchronous code."""
        return run_sync(
            self.aestimate(guide, train_dataset, sample=sample, tokens=tokens, measure=measure, **train_options)
        )

    async def aestimate(
        self,
        guide: Guide,
        train_dataset: Any,
        *,
        sample: int = 2,
        tokens: Mapping[str, tuple[int, int]] | None = None,
        measure: bool = True,
        **train_options: Any,
    ) -> Estimate:
        """What `train(guide, train_dataset, **train_options)` is expected to spend:
        calls, tokens and dollars, in total and by role (agent, optimizer, aggregator,
        validation, check: the noise probe and the final check's first look, test), with
        its assumptions and the budgets it would exceed.

        The calls are counted from the settings (steps x each step's calls, the test
        evaluations); their tokens are measured on `sample` examples of the first batch
        (the agent and guide on each, then one proposal and one aggregation where the run
        makes them), unless `tokens` gives them: {"agent": (prompt, completion) tokens per
        rollout, "optimizer": ... per proposal call, "aggregator": ... per call}. With every
        role given, no call is made. `measure=False` makes no call either: the roles not
        given are assumed from the text of the values and the first examples (the first
        assumption says so). `Estimate.spent` is what measuring cost.
        """
        options = _train_options(self.atrain, train_options)
        check_int("sample", sample, minimum=1)
        _check_guide(guide)
        batch_size, num_epochs = options["batch_size"], options["num_epochs"]
        check_int("batch_size", batch_size, minimum=1)
        check_int("num_epochs", num_epochs, minimum=0)
        train = self._prepare(guide, train_dataset, stepsize=options["stepsize"], batch_size=batch_size,
                              seed=options["seed"], min_score=options["min_score"])  # fmt: skip
        loader = DataLoader(train, batch_size=batch_size, shuffle=options["shuffle"], seed=options["seed"])
        test = load_dataset(options["test_dataset"]) if options["test_dataset"] is not None else []
        check_examples(guide, loader.dataset, "train_dataset")
        check_examples(guide, test, "test_dataset")
        return await Costing(self).estimate(guide, loader, test, options, sample=sample, tokens=tokens, measure=measure)

    async def _measure_units(
        self, guide: Guide, sample: list[Example], given: dict[str, Any], options: dict[str, Any]
    ) -> tuple[dict[str, PerCall], list[str], list[Rollout]]:
        """Tokens per unit of work by role, the assumptions, and the sample's rollouts (none
        when the agent's tokens are given): here the agent's rollout (a subclass adds its
        proposers' and aggregator's calls)."""
        agent_models = models_in(self.agent)
        found = given_per_call(given, "agent", agent_models[0] if agent_models else None)
        if found is not None:
            return {"agent": found}, ["agent: one model call per rollout, with the tokens given"], []
        rollouts, units = await self._sample_rollouts(guide, sample, options)
        note = f"agent: {units.calls:.1f} calls per rollout as measured on {len(rollouts)} training examples"
        return {"agent": units}, [note], rollouts

    async def _sample_rollouts(
        self, guide: Guide, sample: list[Example], options: dict[str, Any]
    ) -> tuple[list[Rollout], PerCall]:
        """The agent and guide on `sample`, and their calls per rollout."""
        with meter_usage() as meter:
            rollouts = await self.executor.run(
                self.agent, guide, sample, min_score=options["min_score"], timeout=options["rollout_timeout"]
            )
        if rollouts and all(r.failed for r in rollouts):
            raise OptoValueError(
                f"the agent or guide failed on all {len(rollouts)} examples the estimate ran "
                f"({rollouts[0].error}): fix that before estimating or training"
            )
        return rollouts, per_unit(meter.by_model, len(rollouts), [*models_in(self.agent), *models_in(guide)])

    def _validation_assumption(self, steps: int) -> str:
        return "validation: none (this trainer validates no candidates)"

    def train(
        self,
        guide: Guide,
        train_dataset: Any,
        *,
        stepsize: float = 0.5,
        num_epochs: int = 1,
        batch_size: int = 1,
        test_dataset: Any = None,
        eval_frequency: int | None = None,
        log_frequency: int | None = 1,
        min_score: float | None = 0.0,
        verbose: bool = False,
        run_dir: str | Path | None = None,
        resume: bool = False,
        seed: int = 0,
        shuffle: bool = True,
        progress: bool = True,
        max_failures: int | float | None = DEFAULT_MAX_FAILURES,
        rollout_timeout: float | None = None,
        callbacks: list[Callback] | None = None,
        stop: StopCondition | None = None,
        budget: Budget | None = None,
        confirm: bool | Callable[[Estimate], bool] = False,
        logged: Sequence[LoggedRollout] | None = None,
    ) -> TrainResult:
        """`atrain`, run to the end from synchronous code; it also works inside a running
        event loop (Jupyter). The arguments are `atrain`'s."""
        options = {name: value for name, value in locals().items() if name not in ("self", "guide", "train_dataset")}
        return run_sync(self.atrain(guide, train_dataset, **options))

    def _prepare(
        self, guide: Guide, train_dataset: Any, *, stepsize: float, batch_size: int, seed: int, min_score: float | None
    ) -> Any:
        """The training data a subclass trains on (the hook where a trainer holds some out)."""
        return train_dataset

    async def atrain(
        self,
        guide: Guide,
        train_dataset: Any,
        *,
        stepsize: float = 0.5,
        num_epochs: int = 1,
        batch_size: int = 1,
        test_dataset: Any = None,
        eval_frequency: int | None = None,
        log_frequency: int | None = 1,
        min_score: float | None = 0.0,
        verbose: bool = False,
        run_dir: str | Path | None = None,
        resume: bool = False,
        seed: int = 0,
        shuffle: bool = True,
        progress: bool = True,
        max_failures: int | float | None = DEFAULT_MAX_FAILURES,
        rollout_timeout: float | None = None,
        callbacks: list[Callback] | None = None,
        stop: StopCondition | None = None,
        budget: Budget | None = None,
        confirm: bool | Callable[[Estimate], bool] = False,
        logged: Sequence[LoggedRollout] | None = None,
    ) -> TrainResult:
        """Train for `num_epochs` over `train_dataset` in batches of `batch_size`.

        Args:
            guide: scores each output (`ExactMatchGuide`, `LLMJudgeGuide`, your own `Guide`).
            train_dataset: `Example`s, `(x, info)` pairs, `{"x", "info"}` dicts, Trace's
                `{"inputs", "infos"}`, or a JSONL path; a malformed row is refused, with its
                index, before any model call.
            stepsize: how far an update may move from the current values (the aggregator
                weighs the current values by `1 - stepsize`), in [0, 1].
            num_epochs: passes over `train_dataset`.
            batch_size: examples per step.
            test_dataset: evaluated at the start and at the end (and every
                `eval_frequency` steps); each evaluation runs the agent on all of it.
            eval_frequency: evaluate `test_dataset` every this many steps (None: only at
                the start and the end).
            log_frequency: one INFO line every this many steps (score, decision, calls,
                tokens, cost so far); None: none.
            min_score: the score of a rollout whose agent or guide raised (or timed out), in
                every mean: 0.0 by default, so a crash never raises a score; None leaves
                failed rollouts out of means (their count is reported either way).
            verbose: print every prompt sent to the proposers and the aggregator, and the reply.
            run_dir: write the ledger, metrics and a checkpoint after every step there.
            resume: continue the run in `run_dir` from its last completed step.
            seed: the seed of the shuffle, the hold-out split and the proposers' sampling.
            shuffle: shuffle `train_dataset` each epoch.
            progress: show a progress bar.
            max_failures: stop cleanly when the failed rollouts of one batch or one
                evaluation reach this: an int counts them, a float is a fraction (the
                default 1.0: all of them); None never stops.
            rollout_timeout: seconds after which a rollout (agent + guide on one example)
                is a failed rollout.
            callbacks: `opto.Callback`s that observe every ledger event, every step's
                `StepRecord`, every evaluation and the result; one that raises is detached.
            stop: a stop condition (`MaxCalls`, `MaxCost`, `MaxTime`, `NoImprovement`,
                `TargetScore`, `StopFile`, combined with `|` and `&`), checked before each
                step; the run then ends as a finished one does and `stopped_reason` names it.
            budget: an `opto.Budget` counting every model call of the run (agent,
                proposers, aggregator, validation, evaluation, on workers too) on top of each
                model's own budget. A budget that cannot pay for one step (and the initial
                evaluation) is refused before the first step, with the figure needed.
            confirm: before any call of the run, estimate what it will spend without a
                call (`estimate()` with token figures assumed from the text of the values and
                inputs, said in its assumptions), print it and ask on the terminal (True), or
                ask a function of the `Estimate` (returning True to go on). A no raises
                `RunNotConfirmed`: nothing was sent. With `run_dir`, the estimate is kept as
                estimate.json, beside what the run spent (`opto report`).
            logged: `LoggedRollout`s, production's runs of the starting values with their
                feedback: a new run's first step takes them as its evidence (the guide
                judges the recorded outputs, the recorded feedback is shown beside its
                own) and proposes from them without running the agent on them; its
                candidates are screened on a sample of the logged inputs the guide can
                judge, as many as the validation set holds (a batch's worth under a
                metric-call limit; the current values' side is the judged records: no
                call; the first training batch when the guide can judge fewer than a
                batch of them), then validated as in any step.

        Returns:
            A `TrainResult`: scores, decisions, final values, usage and `stopped_reason`.

        A `BudgetExceeded`, Ctrl-C or SIGTERM stops the run cleanly after saving what was
        done; `resume=True` continues it.
        """
        self._check_train_arguments(guide, locals())
        estimate = None
        if confirm is not False:
            sizing = {"batch_size": batch_size, "num_epochs": num_epochs, "test_dataset": test_dataset,
                       "eval_frequency": eval_frequency, "stepsize": stepsize, "seed": seed, "shuffle": shuffle,
                       "min_score": min_score, "rollout_timeout": rollout_timeout, "budget": budget}  # fmt: skip
            # Nothing is sent before the answer: the estimate's tokens come from the text alone.
            estimate = await self.aestimate(guide, train_dataset, measure=False, **sizing)
            ask_to_confirm(estimate, confirm)
        started = time.monotonic()
        train_dataset = self._prepare(guide, train_dataset, stepsize=stepsize, batch_size=batch_size, seed=seed,
                                      min_score=min_score)  # fmt: skip
        loader = DataLoader(train_dataset, batch_size=batch_size, shuffle=shuffle, seed=seed)
        test = load_dataset(test_dataset) if test_dataset is not None else None
        # Every example the run will use, checked against what the guide needs before any call.
        check_examples(guide, loader.dataset, "train_dataset")
        check_examples(guide, self.validation_examples(), "the validation set")
        check_examples(guide, self.check_set(), "the final check's examples")
        check_examples(guide, test or [], "test_dataset")
        config = {
            "batch_size": batch_size,
            "seed": seed,
            "shuffle": shuffle,
            "num_examples": len(loader.dataset),
            "stepsize": stepsize,
            "num_epochs": num_epochs,
            **self.extra_config,
        }
        observers = CallbackList(callbacks or [])
        self._progress = progress
        run = RunDir(run_dir) if run_dir is not None else None
        state = self._start_state(run, resume, loader, config)
        writer = self._writer(run, state, estimate)
        self.load_state_dict(state.trainer_state)
        observers.call("on_train_start", self, {**config, "resumed_at_step": state.step, "run_dir": run_dir})
        self.check_budgets(budget, batch_size, test if state.step == 0 and not state.test_scores else None)
        options = TrainOptions(
            stepsize=stepsize, num_epochs=num_epochs, eval_frequency=eval_frequency, log_frequency=log_frequency,
            min_score=min_score, verbose=verbose, progress=progress, max_failures=max_failures,
            rollout_timeout=rollout_timeout, stop=stop, budget=budget, logged=list(logged or []),
        )  # fmt: skip
        session = Session(self, guide, options, loader, test, run, writer, state, observers, started=started)
        await session.run_all()
        result = session.result()
        observers.call("on_train_end", result)
        _log_end(result)
        if session.failure is not None:  # saved; the caller's script must not go on as if it had trained
            raise _stopped_by_failures(session.failure, result, run_dir) from session.failure
        return result

    def _check_train_arguments(self, guide: Guide, given: Mapping[str, Any]) -> None:
        """`atrain`'s arguments, each checked before anything is read or sent."""
        _check_guide(guide)
        check_number("stepsize", given["stepsize"], low=0.0, high=1.0)
        check_int("num_epochs", given["num_epochs"], minimum=0)
        check_int("batch_size", given["batch_size"], minimum=1)
        check_int("eval_frequency", given["eval_frequency"], minimum=1, none_ok=True)
        check_int("log_frequency", given["log_frequency"], minimum=1, none_ok=True)
        check_number("min_score", given["min_score"], none_ok=True)
        check_int("seed", given["seed"], minimum=0)
        for name in ("verbose", "resume", "shuffle", "progress"):
            check_flag(name, given[name])
        validate_max_failures(given["max_failures"])
        if given["logged"]:
            if not self.takes_logged:
                raise OptoValueError(f"{type(self).__name__} does not take logged rollouts: use AggregatedUpdate")
            logged_examples(given["logged"])  # each record checked before any call
        check_number("rollout_timeout", given["rollout_timeout"], low=0.0, open_low=True, none_ok=True)

    def _writer(self, run: RunDir | None, state: Checkpoint, estimate: Estimate | None) -> RunDirWriter | None:
        """The run directory's writer (None without one), with the starting values and the
        estimate kept before anything else: a folder with run files always has a checkpoint."""
        writer = None
        if run is not None:  # resume checked that the ledger holds the records the checkpoint counts
            written = state.ledger_records if state.ledger_records is not None else len(run.ledger())
            writer = RunDirWriter(run, written=written)
            if estimate is not None and not run.estimate_path.exists():
                atomic_write_json(run.estimate_path, estimate.model_dump(mode="json"))
        if not state.initial_parameters:
            state.initial_parameters = self.agent.stored_values()
            state.parameters = dict(state.initial_parameters)
            if writer is not None:
                writer.save_checkpoint(state)
        return writer

    def _start_state(self, run: RunDir | None, resume: bool, loader: DataLoader, config: dict[str, Any]) -> Checkpoint:
        if run is None:
            if resume:
                raise OptoValueError("resume=True needs run_dir: the folder of the run to continue")
            return Checkpoint(config=config)
        state = open_run(run, self.agent, loader, config, resume, extra_keys=tuple(self.extra_config))
        searched = (state.final_check or {}).get("search_parameters")
        if searched and searched != state.parameters:  # a checked run goes on from the search's own values
            self.agent.apply(searched)
            state.parameters = self.agent.stored_values()
        return state

    async def _evaluate(self, test: list[Example], ctx: StepContext) -> EvalResult:
        return await aevaluate(
            self.agent,
            ctx.guide,
            test,
            executor=self.executor,
            min_score=ctx.min_score,
            progress=self._progress,
            max_failures=ctx.max_failures,
            rollout_timeout=ctx.rollout_timeout,
            failure_log=ctx.failure_log,
        )

    @staticmethod
    def _track_best(state: Checkpoint, record: StepRecord) -> None:
        """Keep the values with the best validation score seen so far (the step's starting
        values are scored by its decisions too)."""
        scored = [
            (d.current_score, record.start_values)
            for d in record.decisions[:1]
            if d.current_score is not None and record.start_values
        ]
        if record.accepted and record.candidate_score is not None:
            scored.append((record.candidate_score, state.parameters))
        for score, values in scored:
            if state.best is None or score > state.best["score"]:
                state.best = {"step": record.step, "score": score, "parameters": dict(values)}

    def _account(self, state: Checkpoint, ctx: StepContext, record: StepRecord, loader: DataLoader) -> None:
        state.step, state.epoch = ctx.step, ctx.epoch
        state.train_scores.append(record.score)
        state.train_failed.append(
            sum(1 for e in record.events if isinstance(e, RolloutEvent) and e.phase == "train" and e.error)
        )
        decisions = [{**d.model_dump(mode="json"), "step": ctx.step} for d in record.decisions]
        wins = [d for d in decisions if is_rejected_win(d)]
        state.rejected_wins += len(wins)
        state.best_rejected_win = best_rejected_win(wins, state.best_rejected_win)
        if record.accepted is True:
            state.accepted += 1
        elif record.accepted is False:
            state.rejected += 1
        else:
            state.no_update += 1
        state.loader_state = loader.state_dict()
        state.parameters = self.agent.stored_values()
        state.trainer_state = self.state_dict()
        state.pending_metrics = {
            "step": state.step,
            "epoch": state.epoch,
            "score": record.score,
            "accepted": record.accepted,
            "candidate_score": record.candidate_score,
        }

    @staticmethod
    def _save(writer: RunDirWriter | None, state: Checkpoint, started: float) -> None:
        """Write the metrics line the checkpoint owes (a finished step's, or the final one as
        it is), then a checkpoint that no longer owes it (still owed if the line failed)."""
        metrics = state.pending_metrics
        if writer is None or metrics is None:
            state.pending_metrics = None
            return
        if not metrics.get("final"):
            total = sum(state.usage.values(), UsageStats())
            metrics = {
                **metrics,
                "test_score": state.test_scores[-1][1]
                if state.test_scores and state.test_scores[-1][0] == state.step
                else None,
                "test_interval": state.test_intervals.get(state.step)
                if state.test_scores and state.test_scores[-1][0] == state.step
                else None,
                "calls": total.calls,
                "cached_calls": total.cached_calls,
                "tokens": total.total_tokens,
                "cost_usd": total.cost_usd,
                "elapsed_s": round(time.monotonic() - started, 3),
            }
        writer.run.log_metrics(metrics)
        state.pending_metrics = None
        writer.save_checkpoint(state)

    def _result(self, state: Checkpoint, stopped: str | None, run: RunDir | None, started: float) -> TrainResult:
        return TrainResult(
            train_scores=state.train_scores,
            test_scores=state.test_scores,
            test_intervals={
                step: (found[0], found[1]) if found else None for step, found in state.test_intervals.items()
            },
            steps=state.step,
            accepted=state.accepted,
            rejected=state.rejected,
            no_update=state.no_update,
            usage=sum(state.usage.values(), UsageStats()),
            usage_by_model=state.usage,
            metric_calls=state.rollouts,
            final_parameters=self.agent.stored_values(),
            stopped_reason=stopped,
            run_dir=str(run.path) if run else None,
            seconds=round(time.monotonic() - started, 3),
            train_failed=state.train_failed,
            test_failed=state.test_failed,
            rejected_wins=state.rejected_wins,
            best_rejected_win=state.best_rejected_win,
            final_check=FinalCheckResult.model_validate(state.final_check) if state.final_check else None,
            diagnosis=summarize(
                steps=state.step,
                accepted=state.accepted,
                no_update=state.no_update,
                rejected_wins=state.rejected_wins,
                best=state.best_rejected_win,
            ),
        )


def _check_guide(guide: Any) -> None:
    if not hasattr(guide, "aget_feedback"):
        raise OptoTypeError(
            f"guide must be an opto Guide with get_feedback(x, output, info), got {type(guide).__name__}"
        )


def _train_options(atrain: Callable[..., Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """`atrain`'s keyword defaults with `given` over them; an unknown name is refused."""
    defaults = {
        name: p.default
        for name, p in inspect.signature(atrain).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise OptoValueError(f"train() has no option {', '.join(unknown)}; its options: {', '.join(sorted(defaults))}")
    return {**defaults, **given}


def models_in(root: Any, depth: int = 6) -> list[Model]:
    """The opto `Model`s reachable from `root`'s attributes, lists and dicts (each once).

    Modules are not entered (an adapter that holds `litellm` owns none of its models),
    and each container is read from a copy: looking at an object may change another's
    attributes (lazy imports), which must not break the walk."""
    found: dict[int, Model] = {}
    seen: set[int] = set()

    def walk(value: Any, left: int) -> None:
        if id(value) in seen or left < 0 or isinstance(value, (type, types.ModuleType)):
            return
        seen.add(id(value))
        if isinstance(value, Model):
            found[id(value)] = value
            return
        if isinstance(value, (list, tuple)):
            children = list(value)
        elif isinstance(value, dict):
            children = list(value.values())
        elif hasattr(value, "__dict__"):
            children = list(vars(value).values())
        else:
            return
        for child in children:
            walk(child, left - 1)

    walk(root, depth)
    return list(found.values())


def _log_end(result: TrainResult) -> None:
    """The run's last lines: scores with their failed examples, and the diagnosis if any."""
    if result.test_scores:
        logger.info(
            "test score: %s -> %s%s",
            fmt(result.initial_test_score),
            fmt(result.final_test_score),
            f" ({result.final_test_failed} failed examples scored as min_score)" if result.final_test_failed else "",
        )
    if sum(result.train_failed):
        logger.warning("%d training rollouts failed (the agent or guide raised)", sum(result.train_failed))
    if result.diagnosis:
        # Nothing learned is a warning (shown with no logging set up); a rejected win beside accepted ones, information.
        (logger.warning if not result.accepted else logger.info)("%s", result.diagnosis)


def _stopped_by_failures(failure: TooManyFailures, result: TrainResult, run_dir: str | Path | None) -> TooManyFailures:
    """The error a run stopped by failing rollouts raises, saying how to continue it."""
    how = (
        f"the run is saved in {run_dir}: fix the cause, then call train() again with the same run_dir and "
        f"resume=True to continue from step {result.steps}"
        if run_dir is not None
        else "pass run_dir= to keep a run that can be resumed after such a stop"
    )
    error = TooManyFailures(f"{failure}; {how}")
    error.result = result  # what the run did before it stopped
    return error
