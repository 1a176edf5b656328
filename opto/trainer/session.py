"""One `train()` call, as its phases: start, steps, finish, close.

`Minibatch.atrain` checks its options and opens a `Session`; the session runs the phases
in order (`run`), each a short method:

- `evaluate_start`: the test set before any update (a new run only);
- `settle_owed`: a resumed run first writes what its last step still owed;
- `run_steps`: one step per batch (`one_step`) until the data or a stop condition ends;
- `finish_run`: the trainer's final values, the final check, the final test evaluation;
- `close`: whatever stopped the run, keep what it did.

Nothing here decides what a step does (the trainer's `step`) or what the run returns
(`Minibatch._result`); the session only orders, saves and reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from ..core.agent import Agent
from ..core.data import DataLoader, Example
from ..core.guides import Guide
from ..core.logged import LoggedRollout
from ..core.rollout import MetricCallsSpent, RolloutCounter, count_rollouts, uncounted
from ..llm.errors import BudgetExceeded
from ..llm.usage import Budget, UsageMeter, UsageStats, budget_scope, meter_usage
from ..run.callbacks import CallbackList, deliver_step
from ..run.events import StepRecord
from ..run.ledger import Checkpoint, RunDir, RunDirWriter
from ..run.results import EvalResult, FinalCheckResult, TrainResult
from ..search.stopping import RunProgress, StopCondition, metric_call_limit
from .context import StepContext
from .failures import FailureLog, TooManyFailures


class Trainer(Protocol):
    """What a session needs of its trainer (`Minibatch`): the step, and its bookkeeping."""

    agent: Agent

    async def step(self, batch: list[Example], ctx: StepContext) -> StepRecord: ...
    async def _evaluate(self, test: list[Example], ctx: StepContext) -> EvalResult: ...
    async def _final_check_phase(self, state: Checkpoint, ctx: StepContext) -> bool: ...
    def finish(self) -> bool: ...
    def reserved_calls(self) -> int: ...
    def rollouts_to_accept(self, batch_size: int) -> int: ...
    def _account(self, state: Checkpoint, ctx: StepContext, record: StepRecord, loader: DataLoader) -> None: ...
    def _track_best(self, state: Checkpoint, record: StepRecord) -> None: ...
    def _save(self, writer: RunDirWriter | None, state: Checkpoint, started: float) -> None: ...
    def _not_checked(self, state: Checkpoint, stopped: str | None) -> FinalCheckResult | None: ...
    def _result(self, state: Checkpoint, stopped: str | None, run: RunDir | None, started: float) -> TrainResult: ...


__all__ = ["Session", "TrainOptions", "Trainer"]

logger = logging.getLogger(__name__)


@dataclass
class TrainOptions:
    """`train()`'s options once checked (see `Minibatch.atrain` for each)."""

    stepsize: float
    num_epochs: int
    eval_frequency: int | None
    log_frequency: int | None
    min_score: float | None
    verbose: bool
    progress: bool
    max_failures: int | float | None
    rollout_timeout: float | None
    stop: StopCondition | None
    budget: Budget | None
    logged: list[LoggedRollout] = field(default_factory=list)


@dataclass
class Session:
    """The state of one `train()` call and its phases (see the module's doc)."""

    trainer: Trainer
    guide: Guide
    options: TrainOptions
    loader: DataLoader
    test: list[Example] | None
    run: RunDir | None
    writer: RunDirWriter | None
    state: Checkpoint
    observers: CallbackList
    started: float = field(default_factory=time.monotonic)
    failure_log: FailureLog = field(default_factory=FailureLog)
    stopped: str | None = None
    failure: TooManyFailures | None = None
    _unfinished: StepContext | None = None
    _checking: StepContext | None = None  # the final check's, while it runs
    _meter: UsageMeter | None = None
    _rollouts: RolloutCounter | None = None

    def __post_init__(self) -> None:
        self.prior_usage = dict(self.state.usage)
        self.prior_rollouts = self.state.rollouts
        self.bar = tqdm(
            total=self.options.num_epochs * len(self.loader),
            initial=self.state.step,
            disable=not self.options.progress,
            desc=type(self.trainer).__name__,
            unit="step",
        )

    # The phases, in order ---------------------------------------------------------------

    async def run_all(self) -> None:
        """Every phase; a budget, too many failures or SIGTERM stop the run cleanly."""
        options = self.options
        # With bars on screen, log lines (warnings, the per-step line) are written above them.
        with (
            meter_usage() as self._meter,
            count_rollouts() as self._rollouts,
            logging_redirect_tqdm() if options.progress else contextlib.nullcontext(),
            budget_scope(options.budget) if options.budget is not None else contextlib.nullcontext(),
            stop_on_sigterm() as terminated,
        ):
            try:
                await self.evaluate_start()
                await self.settle_owed()
                await self.run_steps()
                await self.finish_run()
            except BudgetExceeded as exc:
                self.stopped = f"budget exceeded: {exc}"
                logger.warning("training stopped after step %d: %s", self.state.step, self.stopped)
            except TooManyFailures as exc:
                self.stopped, self.failure = f"too many failures: {exc}", exc
                logger.error("training stopped after step %d: %s", self.state.step, self.stopped)
            except asyncio.CancelledError:
                if not terminated:
                    raise
                asyncio.current_task().uncancel()  # type: ignore[union-attr]
                self.stopped = "SIGTERM"
                logger.warning(
                    "training stopped by SIGTERM after step %d (saved; resume=True continues)", self.state.step
                )
            finally:
                self.close()

    async def evaluate_start(self) -> None:
        """The test set under the starting values, once per run (not again on resume)."""
        if self.test is not None and self.state.step == 0 and not self.state.test_scores:
            self.state.test_scores.append((0, await self.evaluate(self.context(0, 0))))
            self._checkpoint()

    async def settle_owed(self) -> None:
        """A resumed run writes the metrics line its last step (or final evaluation) owed."""
        owed = self.state.pending_metrics
        if owed is not None and owed.get("final"):
            self.trainer._save(self.writer, self.state, self.started)
        elif owed is not None:  # resumed inside the evaluation after a step
            await self.finish_step(self.context(self.state.step, self.state.epoch))

    async def run_steps(self) -> None:
        """One step per batch, until the data ends or a stop condition says so. A
        `MaxMetricCalls` limit also holds inside a step: rollouts that would pass it (less
        what the final check keeps) are not run, and the step ends unfinished."""
        limit = metric_call_limit(self.options.stop)
        counter = self._rollouts
        if limit is not None and counter is not None:
            counter.limit = max(0, limit - self.prior_rollouts - self.trainer.reserved_calls())
            self.warn_if_too_small(limit, counter.limit)
        try:
            if self.options.logged and self.state.step == 0 and not self.should_stop():
                # Proposed from production's records, screened on them; the first training batch
                # stands in where the guide cannot judge them.
                first = self.loader.dataset[: self.loader.batch_size]
                await self.one_step(0, first, logged=self.options.logged)
            for epoch, _, batch in self.loader.iter_batches(self.options.num_epochs):
                if self.should_stop():
                    return
                await self.one_step(epoch, batch)
        except MetricCallsSpent as exc:
            self.stopped = f"MaxMetricCalls({limit}): step {self.state.step + 1} stopped unfinished: {exc}"
            logger.info("%s", self.stopped)
        finally:
            if counter is not None:
                counter.limit = None  # the final check runs on what was kept for it

    def warn_if_too_small(self, limit: int, left: int) -> None:
        """Say before any metric call when a limit leaves the search too little to accept
        anything: the run can then only end where it started."""
        need = self.trainer.rollouts_to_accept(self.loader.batch_size)
        if self.state.step == 0 and left < need:
            kept = self.trainer.reserved_calls()
            logger.warning(
                "MaxMetricCalls(%d) leaves the search %d metric calls%s, and accepting a first candidate takes at "
                "least %d (the noise probe, a batch of %d, and validating a candidate that wins): this run can only "
                "return its start. Give max_metric_calls=%d or more, or a smaller batch or validation set",
                limit,
                left,
                f" ({kept} kept for the final check)" if kept else "",
                need,
                self.loader.batch_size,
                need + kept,
            )

    async def finish_run(self) -> None:
        """The trainer's final values, the final check, and the test set under the values
        returned (measured again only when they changed or were not measured at this step)."""
        state, trainer = self.state, self.trainer
        changed = trainer.finish()
        # The check's rollouts go to the ledger, also when a budget stops it (`close`).
        if self._unfinished is not None and self.writer is not None:  # a step a metric-call limit cut short
            self.writer.keep_unfinished(self._unfinished.step_record)
        self._unfinished = None
        check = self._checking = self.context(state.step, state.epoch)
        limit = metric_call_limit(self.options.stop)
        if limit is not None and self._rollouts is not None:
            check.rollouts_left = max(0, limit - self.prior_rollouts - self._rollouts.count)
        changed = await trainer._final_check_phase(state, check) or changed
        self._checking = None
        self.write_events(check)
        state.parameters = trainer.agent.stored_values()
        self._checkpoint()
        measured = bool(state.final_evaluations) and state.final_evaluations[-1] == state.step  # a finished run resumed
        if (
            self.test is not None
            and not measured
            and (changed or not state.test_scores or state.test_scores[-1][0] != state.step)
        ):
            final = await self.evaluate(self.context(state.step, state.epoch), final=True)
            if state.test_scores and state.test_scores[-1][0] == state.step:
                state.test_scores.pop()  # measured before the final values were chosen
            state.test_scores.append((state.step, final))
            state.final_evaluations.append(state.step)
            state.pending_metrics = {
                "step": state.step,
                "final": True,
                "test_score": final,
                "test_interval": state.test_intervals.get(state.step),
            }
            self._checkpoint()  # the evaluation is kept before its line is written
            trainer._save(self.writer, state, self.started)
        state.finished = True

    def close(self) -> None:
        """Keep what the run did, whatever stopped it."""
        self.bar.close()
        self.tally()
        if self.writer is not None:
            cut_short = self._unfinished or self._checking
            save_on_exit(self.writer, self.state, cut_short.step_record if cut_short is not None else None)

    # A step ----------------------------------------------------------------------------

    def should_stop(self) -> bool:
        """Check the stop condition before a step; its reason becomes `stopped_reason`."""
        stop = self.options.stop
        if stop is None:
            return False
        self.tally()
        self.stopped = stop.check(progress_of(self.state, self.started, self.trainer.reserved_calls()))
        if self.stopped is not None:
            logger.info("training stops before step %d: %s", self.state.step + 1, self.stopped)
        return self.stopped is not None

    async def one_step(self, epoch: int, batch: list[Example], logged: list[LoggedRollout] | None = None) -> None:
        """The trainer's step, accounted and kept (ledger and checkpoint) before its
        evaluation, so a stop there loses nothing; then its metrics line. With `logged`,
        the batch's rollouts are those records, judged but not run again."""
        state, trainer = self.state, self.trainer
        ctx = self._unfinished = self.context(state.step + 1, epoch)
        ctx.logged = logged
        record = await trainer.step(batch, ctx)
        self._unfinished = None
        trainer._account(state, ctx, record, self.loader)
        trainer._track_best(state, record)
        self.tally()
        if self.writer is not None:
            deliver_step(self.writer, record)
            self.writer.save_checkpoint(state)
        deliver_step(self.observers, record)
        await self.finish_step(ctx)
        self.show(record, epoch)

    async def finish_step(self, ctx: StepContext) -> None:
        """Evaluate if due (and not done before an interrupted write), then write the
        step's metrics line: the step is done."""
        state, every = self.state, self.options.eval_frequency
        due = self.test is not None and every and state.step % every == 0
        if due and not (state.test_scores and state.test_scores[-1][0] == state.step):
            state.test_scores.append((state.step, await self.evaluate(ctx)))
        self.tally()
        self.trainer._save(self.writer, state, self.started)

    def show(self, record: StepRecord, epoch: int) -> None:
        """The progress bar, and the step's log line every `log_frequency` steps."""
        state = self.state
        self.bar.update(1)
        failed = sum(state.train_failed)
        self.bar.set_postfix(score=fmt(record.score), accepted=f"{state.accepted}/{state.step}",
                             **({"failed": failed} if failed else {}))  # fmt: skip
        every = self.options.log_frequency
        if every and state.step % every == 0:
            spent = sum(state.usage.values(), UsageStats())
            decision = {True: "accepted", False: "rejected", None: "no candidate"}[record.accepted]
            logger.info(
                "step %d (epoch %d): score %s, %s (candidate %s); %d calls, %d tokens, $%.4f so far",
                state.step,
                epoch,
                fmt(record.score),
                decision,
                fmt(record.candidate_score),
                spent.calls,
                spent.total_tokens,
                spent.cost_usd,
            )

    # Helpers ---------------------------------------------------------------------------

    def context(self, step: int, epoch: int) -> StepContext:
        options = self.options
        return StepContext(
            step=step,
            epoch=epoch,
            guide=self.guide,
            stepsize=options.stepsize,
            min_score=options.min_score,
            verbose=options.verbose,
            max_failures=options.max_failures,
            rollout_timeout=options.rollout_timeout,
            failure_log=self.failure_log,
            step_record=StepRecord(step=step, epoch=epoch),
        )

    async def evaluate(self, ctx: StepContext, final: bool = False) -> float | None:
        """The test set under the current values: logged, told to observers, its interval
        and failures kept in the checkpoint."""
        with uncounted():  # the test set is not part of the search's metric calls
            result = await self.trainer._evaluate(self.test, ctx)  # type: ignore[arg-type]
        if self.run is not None:
            self.run.log_evaluation(ctx.step, result.rollouts, final=final)
        self.observers.call("on_evaluate_end", ctx.step, result)
        self.state.test_intervals[ctx.step] = [result.interval.low, result.interval.high] if result.interval else None
        self.state.test_failed[ctx.step] = result.n_failed
        return result.mean

    def tally(self) -> None:
        """The run's usage and rollouts so far, into the checkpoint's state."""
        self.state.usage = self.usage()
        self.state.rollouts = self.prior_rollouts + (self._rollouts.count if self._rollouts is not None else 0)

    def usage(self) -> dict[str, UsageStats]:
        """The run's usage so far: earlier sessions' (resume) and this one's."""
        return merge_usage(self.prior_usage, self._meter.by_model if self._meter is not None else {})

    def write_events(self, ctx: StepContext) -> None:
        """Events made outside a step (the final check's rollouts) to the ledger and the
        observers, without a step's end."""
        events = ctx.step_record.events if ctx.step_record is not None else []
        for sink in (self.writer, self.observers):
            if sink is not None:
                for event in events:
                    sink.on_event(event)
        if self.writer is not None:
            self.writer.flush()

    def _checkpoint(self) -> None:
        if self.writer is not None:
            self.writer.save_checkpoint(self.state)

    def result(self) -> TrainResult:
        """What `train()` returns; a run stopped before its final check returns the start."""
        unchecked = None
        if not self.state.finished and self.state.final_check is None:
            unchecked = self.trainer._not_checked(self.state, self.stopped)
        result = self.trainer._result(self.state, self.stopped, self.run, self.started)
        if unchecked is not None:
            result.final_check = unchecked
        return result


def merge_usage(*parts: dict[str, UsageStats]) -> dict[str, UsageStats]:
    merged: dict[str, UsageStats] = {}
    for part in parts:
        for name, stats in part.items():
            merged[name] = merged.get(name, UsageStats()) + stats
    return merged


def progress_of(state: Checkpoint, started: float, reserved_calls: int = 0) -> RunProgress:
    """What a stop condition sees before a step."""
    total = sum(state.usage.values(), UsageStats())
    best = state.best or {}
    return RunProgress(
        step=state.step,
        calls=total.calls,
        cost_usd=total.cost_usd,
        rollouts=state.rollouts,
        seconds=time.monotonic() - started,
        best_score=best.get("score"),
        best_step=best.get("step", 0),
        reserved_calls=0 if state.final_check is not None else reserved_calls,
    )


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[list[bool]]:
    """While training in the main thread, SIGTERM cancels the run's task (which saves and
    returns); a handler the program set itself is left alone. Yields whether it came."""
    came: list[bool] = []
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()

    def stop() -> None:
        came.append(True)
        if task is not None:
            task.cancel()

    try:
        if task is None or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            raise RuntimeError("not ours to handle")
        loop.add_signal_handler(signal.SIGTERM, stop)
    except (RuntimeError, ValueError, NotImplementedError):  # another thread, another handler, Windows
        yield came
        return
    try:
        yield came
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def save_on_exit(writer: RunDirWriter, state: Checkpoint, unfinished: StepRecord | None) -> None:
    """Keep what the run did, whatever stopped it, and never more than the files hold: a
    checkpoint that counted a step whose ledger records are not written would lose them
    for good, so then the last saved checkpoint stays and resume redoes the step."""
    try:
        writer.keep_unfinished(unfinished)  # an unfinished step: resume discards and redoes it
    except Exception as exc:
        if writer.owes(state.step):
            logger.error(
                "could not write step %d's ledger records to %s (%s): the checkpoint stays at the last "
                "saved step, and resume=True redoes step %d",
                state.step,
                writer.run.ledger_path,
                exc,
                state.step,
            )
            return
        logger.error(
            "could not write the unfinished step's ledger records to %s (%s); resume redoes that step",
            writer.run.ledger_path,
            exc,
        )
    writer.save_checkpoint(state)


def fmt(score: float | None) -> str:
    return "n/a" if score is None else f"{score:.3f}"
