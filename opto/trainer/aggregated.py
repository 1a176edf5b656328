"""`AggregatedUpdate`: per-instance proposals, merged into candidates, validated, applied.

A step reads top to bottom as its data flow (see `step`): rollouts -> proposals ->
[proposal scores] -> candidates -> decisions -> apply. Each stage adds its events to
the step's `StepRecord`; nothing here writes a file. The search pieces (candidate
selection and its pool, candidate sources, component selection) are objects from
`opto.search`; the Trace-compatible `forward`/`update` is in `trace_compat.py`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._util.async_tools import gather_all
from .._util.files import json_key
from ..core.agent import Agent
from ..core.data import Example, load_dataset
from ..core.guides import Guide
from ..core.logged import logged_examples
from ..core.rollout import Rollout, mean_score, rollouts_left
from ..errors import OptoTypeError, OptoValueError
from ..executors.local import RolloutExecutor
from ..llm.base import Model
from ..llm.errors import BudgetExceeded, LLMError
from ..llm.usage import Budget, meter_usage
from ..run.events import (
    AggregateErrorEvent,
    AppliedEvent,
    CandidateEvent,
    DecisionEvent,
    ParentEvent,
    PoolEvent,
    ProposalErrorEvent,
    ProposalEvent,
    RolloutEvent,
    StepRecord,
)
from ..run.results import FinalCheckResult
from ..search.aggregation import Aggregator, Candidate
from ..search.batching import ProposalBatching
from ..search.candidates import CandidateSource
from ..search.components import ComponentSelector, focused
from ..search.copies import CopyGuard
from ..search.final_check import FinalCheck
from ..search.holdout import HoldOut
from ..search.merge import LineageMerge, MergePlan
from ..search.pool import START_ID, CandidatePool, check_objectives
from ..search.proposers import BatchProposer, Optimizer, Proposal, Proposer
from ..search.registry import make
from ..search.selection import CandidateSelector
from ..search.validation import (
    DatasetValidation,
    Decision,
    MinibatchFirst,
    MinibatchValidation,
    Validation,
    ValidationContext,
    by_score,
    make_validation,
)
from .check_phase import CheckPhase
from .estimate import PerCall, given_per_call, per_unit
from .failures import check_failures
from .final_check import Runner
from .logged import LoggedGuide, ReplayAgent, judged_rollouts
from .minibatch import Minibatch, StepContext
from .proposal_scoring import check_score_proposals, score_proposals
from .trace_compat import InstanceOutput, TraceCompatible

__all__ = ["AggregatedUpdate", "InstanceOutput"]

logger = logging.getLogger(__name__)


class AggregatedUpdate(TraceCompatible, Minibatch):
    """Propose per instance, aggregate, validate, accept or roll back.

    Args:
        agent: the agent to train.
        optimizer: the per-instance proposer (the LLM `Optimizer`), or a list of proposers
            (e.g. `[Optimizer(llm), DemoProposer()]`); each is asked for every instance.
        llm: the aggregator's model (the first `Optimizer`'s model when None; with only
            demo proposers none is needed, as demo lists are merged by rule).
        max_tokens: the aggregator reply's token limit ("auto": sized to the values merged).
        aggregator: a configured `Aggregator` (then `llm` and `max_tokens` are unused).
        concurrency: agent runs and LLM calls the trainer starts at once.
        executor: where rollouts run (`opto.RolloutExecutor`; default in-process asyncio).
        validation: "auto" (the default: hold out a validation split from the training data,
            `holdout`, and accept with `MinibatchFirst(split, race=8, accept_ties=True)`; on
            a training set too small to split, the same rule on all the training examples),
            "minibatch" (re-run the batch with the candidate), "none" (always accept), a
            dataset to validate on (a greedy search: `MinibatchFirst(dataset, race=8,
            accept_ties=True)`; pool-based selection: `DatasetValidation(dataset)`), or a
            `Validation`.
        holdout: the split `validation="auto"` holds out (`opto.search.HoldOut`: a quarter
            of the examples, at least 16, at most 200, drawn with the run's seed).
        final_check: how `train()` checks the values it returns against the start
            (`opto.search.FinalCheck`: a quarter of the training data, or 120 examples where
            that leaves the search as many, reserved before the run from 96 examples up;
            below that the training and validation examples again, a deterministic agent's
            own answers tested at 0.1 over the candidates compared; a one-sided paired test
            at 0.1). Values not shown
            better are not returned: the run's best validated values if they are, else
            the start (`TrainResult.final_check`). None: return the search's values unchecked.
        improvement_threshold: a candidate must beat the current mean by more than this.
        score_proposals: None, or "instance" / "minibatch": also score each proposal's update
            on its own (see `opto.trainer.proposal_scoring`), for preference data.
        candidates: where a step's candidates come from: "merged" (the aggregator's merge
            of all proposals), "each" (every distinct proposal on its own, no aggregator
            call), "both", or an `opto.search.CandidateSource`. All are validated at once.
        objectives: ("score",) or, with selection="pareto", ("score", "cost") and/or
            "latency": the front also keeps a candidate that is cheaper (dollars when the
            models have prices, else tokens, per validation rollout) or faster at an equal
            or better score, and the run ends with the best score, ties going to the cheaper.
        merge_every: with selection="pareto", every N steps merge two front members that
            descend from a common ancestor, parameter by parameter from the lineage that
            changed it (`opto.search.merge`); the merge is validated like any candidate
            and keeps both parents in the pool. A merge step makes no proposals.
        selection: "greedy" (one incumbent: each step starts from the current values),
            "pareto" (a pool of every validated candidate; each step starts from a member
            of its Pareto front), "epsilon_greedy" (the pool's best mean, now and then any
            member), "top_k" (any of the best 3), or an `opto.search.CandidateSelector`.
            Pool-based selection needs a validation dataset and ends with the pool's best
            mean (`opto.search.selection`).
        proposals: "reflective" (a proposer that can, e.g. `Optimizer`, is asked once a
            step and shown the batch's failures together, with a success for contrast; a
            batch where everything went right costs no call) or "per_instance" (each
            proposer is asked for every rollout, and the aggregator merges). Proposers
            without `propose_batch` (e.g. `DemoProposer`) are asked per instance either way,
            and those that only make sense once a step (`TPEProposer`) once a step; a
            `opto.search.ProposalBatching` decides it any other way.
        components: which trainable parameters a step proposes for: "all", "round_robin"
            (one a step, in turn; the others are shown as fixed), or an
            `opto.search.ComponentSelector`.
    """

    takes_logged = True

    def __init__(
        self,
        agent: Agent,
        optimizer: Proposer | Sequence[Proposer],
        llm: Model | None = None,
        max_tokens: int | str = "auto",
        *,
        aggregator: Aggregator | None = None,
        concurrency: int = 16,
        executor: RolloutExecutor | None = None,
        validation: str | Validation | Any = "auto",
        holdout: HoldOut | None = None,
        final_check: FinalCheck | None | str = "auto",
        improvement_threshold: float = 0.0,
        score_proposals: str | None = None,
        selection: str | CandidateSelector = "greedy",
        candidates: str | CandidateSource = "merged",
        merge_every: int | None = None,
        objectives: Sequence[str] = ("score",),
        proposals: str | ProposalBatching = "reflective",
        components: str | ComponentSelector = "all",
    ) -> None:
        super().__init__(agent, concurrency=concurrency, executor=executor)
        self.batching = make("proposals", proposals)
        self.proposals = self.batching.name
        self.components = make("components", components)
        self._focus: list[str] | None = None  # the parameters this step proposes for
        self.proposers: list[Proposer] = _check_proposers(optimizer)
        self.optimizer = self.proposers[0]
        if llm is None:
            llm = next((p.model for p in self.proposers if isinstance(p, Optimizer)), None)
        self.aggregator = aggregator or Aggregator(llm, max_tokens=max_tokens)
        self.candidate_source = make("candidates", candidates, aggregator=self.aggregator)
        self.auto_validation = isinstance(validation, str) and validation == "auto"
        self.holdout = holdout or HoldOut()
        if isinstance(final_check, str) and final_check == "auto":
            final_check = FinalCheck()
        if final_check is not None and not isinstance(final_check, FinalCheck):
            raise OptoTypeError(f"final_check must be a FinalCheck, 'auto' or None, got {final_check!r}")
        self.final_check = final_check
        # The noise probe, what the check keeps of the search, and the check (None: no check).
        self.checker = CheckPhase(final_check) if final_check is not None else None
        self._check_examples: list[Example] = []  # reserved for the final check
        self._train_examples: list[Example] = []  # what the run trains on
        self._incumbent_score: float | None = None  # the current values' score on the examples decided on
        self._guard: CopyGuard | None = None
        self._copy_note: str | None = None  # asks the LLM proposers for general rules (see _note_copies)
        # With "auto", the split is made when train() sees the data; until then (e.g. for a
        # Trace-style update()) candidates are accepted on the batch with a paired test.
        self.improvement_threshold = improvement_threshold
        self.score_proposals = check_score_proposals(score_proposals)
        self.selector = make("selection", selection)
        self.selection = self.selector.name
        self.validation = MinibatchValidation() if self.auto_validation else make_validation(validation)
        if type(self.validation) is DatasetValidation and not isinstance(validation, Validation):
            self.validation = self._for_a_dataset(self.validation)
        if self.selector.uses_pool and not self.auto_validation and not isinstance(self.validation, DatasetValidation):
            raise OptoValueError(
                f"selection={self.selection!r} keeps a pool of candidates compared example by example on a fixed "
                "validation set: pass validation=<a dataset> (e.g. bigbench(task, split='validation')), not "
                f"{self.validation.name!r}"
            )
        if merge_every is not None and not self.selector.uses_pool:
            raise OptoValueError("merge_every merges lineages of a candidate pool: pass selection='pareto' with it")
        self.merge = LineageMerge(merge_every) if merge_every is not None else None
        self.objectives = check_objectives(objectives, self.selector.uses_pool)
        self.pool = CandidatePool(objectives=self.objectives)
        self._merges_tried: set[str] = set()
        self._seed = 0
        self.aggregator_system_prompt = self.aggregator.system_prompt
        # Limits concurrent proposer calls; one per event loop, since a semaphore is bound
        # to the loop it first waits in (train() and a user's aforward() may use different loops).
        self._gate: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        self._unread_warned: set[str] = set()
        self._read: set[str] = set()  # the parameters some rollout of this run has read

    def _for_a_dataset(self, validation: DatasetValidation) -> DatasetValidation:
        """A user's validation set: a greedy search screens on the batch, races on the set
        and accepts ties (`MinibatchFirst(set, race=8, accept_ties=True)`, measured best
        by `bench/search.py` and `bench/robustness.py`; the final check guards what the run
        returns). A pool needs every candidate scored on the whole set:
        `DatasetValidation(set)`. A proposer that learns from validation scores (`observe`,
        `TPEProposer`) is screened too, and told where a candidate was stopped."""
        if self.selector.uses_pool:
            return validation
        return MinibatchFirst(validation.examples, race=8, accept_ties=True)

    def _prepare(
        self, guide: Guide, train_dataset: Any, *, stepsize: float, batch_size: int, seed: int, min_score: float | None
    ) -> Any:
        self._seed = seed
        examples = load_dataset(train_dataset)
        self.extra_config = {}
        self._check_examples = []
        if self.final_check is not None:
            examples, self._check_examples = self.final_check.reserve(examples, seed)
            self.extra_config["final_check_ids"] = [e.id for e in self._check_examples]
        if self.auto_validation:
            examples = self._hold_out(examples, batch_size)
        self._train_examples = examples
        self._guard = CopyGuard([*examples, *self.validation_examples(), *self._check_examples])
        self._incumbent_score = None
        if self.checker is not None:
            self.checker.reset(examples, self._check_examples, seed)
        self.validation.reset()
        self._unread_warned, self._read = set(), set()
        self.remember(guide, stepsize, min_score)
        return examples

    def _hold_out(self, examples: list[Example], batch_size: int) -> list[Example]:
        """`validation="auto"`: split the training data (recorded in the run's config, so a
        resumed run must draw the same split) and return what is left to train on."""
        split = self.holdout.split(examples, self._seed)
        if split is None:
            if self.selector.uses_pool:
                raise OptoValueError(
                    f"selection={self.selection!r} needs a validation set, and {len(examples)} training examples "
                    f"are too few to hold one out (at least {2 * self.holdout.min_size}): pass validation=<a dataset>"
                )
            # Too few to spare a split: a candidate that wins on its batch is raced on every
            # training example (as GEPA validates on its training set); the final check
            # guards what the run returns.
            self.validation = MinibatchFirst(examples, race=8, accept_ties=True)
            self.extra_config["validation"] = "training set (too few examples to hold out a split)"
            logger.info(
                "validation='auto': %d training examples are too few to hold out a validation split "
                "(at least %d); a candidate that wins on its batch is validated on all of them",
                len(examples),
                2 * self.holdout.min_size,
            )
            return examples
        train, held = split
        self.validation = MinibatchFirst(held, race=8, accept_ties=True)
        self.extra_config.update(
            {"validation": "held out", "holdout": self.holdout.describe(), "validation_ids": [e.id for e in held]}
        )
        logger.info("validation='auto': %d of %d training examples held out to validate on", len(held), len(examples))
        return train

    def validation_examples(self) -> list[Example]:
        return list(self.validation.examples) if isinstance(self.validation, DatasetValidation) else []

    # The step, top to bottom ----------------------------------------------------------

    async def step(self, batch: list[Example], ctx: StepContext) -> StepRecord:
        if self.checker is not None:
            if not self.checker.probed:
                await self._probe_noise(ctx)
            self.checker.note_batch(batch)
        if self.selector.uses_pool and self.pool:
            plan = self.merge.plan(self.pool, self._merges_tried) if self.merge and self.merge.due(ctx.step) else None
            if plan is not None:
                return await self._merge_step(batch, plan, ctx)
            self._start_from_the_pool(ctx)
        if ctx.step_record is not None:
            ctx.step_record.start_values = self.agent.stored_values()
        names = [p.name for p in self.agent.parameters(trainable_only=True) if p.name is not None]
        focus = self.components.select(names, ctx.step)
        self._focus = None if set(focus) >= set(names) else focus  # None: every parameter, no copies needed
        evidence = logged_examples(ctx.logged) if ctx.logged else batch
        logged_guide = LoggedGuide(ctx.guide, ctx.logged) if ctx.logged else None
        rollouts, outputs = await self._rollouts_and_proposals(evidence, ctx, logged_guide)
        proposals = [p for o in outputs for p in o.proposals]
        proposals += await self._propose_batch(rollouts, ctx)
        guard = None
        if logged_guide is not None:
            rollouts, guard = await self._logged_screen(rollouts, logged_guide, batch, ctx)
        if self.score_proposals:
            await score_proposals(
                self.score_proposals,
                self.agent,
                ctx.guide,
                rollouts,
                proposals,
                ctx=ctx,
                min_score=ctx.min_score,
                concurrency=self.concurrency,
                timeout=ctx.rollout_timeout,
                executor=self.executor,
            )
        record = await self._decide(rollouts, proposals, ctx, guard)
        self._tell_scores(record)
        self._note_copies(record)
        return record

    async def _logged_screen(
        self, logged: list[Rollout], guide: LoggedGuide, batch: list[Example], ctx: StepContext
    ) -> tuple[list[Rollout], CopyGuard | None]:
        """What the logged step's candidates are screened against: logged rollouts the guide
        judged itself, the evidence they were proposed from (quotes of their inputs found
        too), or else the current values on the first training batch when the guide judged
        fewer than a batch of inputs. A seeded sample as large as the validation set (a
        screen costs no more than the validation it saves), a batch's worth under a
        metric-call limit (no more than the training batch would cost)."""
        judged = judged_rollouts(logged, guide)
        if len(judged) < len(batch):
            return await self._current_rollouts(batch, ctx), None
        size = self.logged_screen_size(len(batch))
        if len(judged) > size:
            judged = random.Random(self._seed).sample(judged, size)
        screened = [Example(r.x, r.info, id=r.example_id) for r in judged]
        known = list(self._guard.examples.values()) if self._guard is not None else []
        return judged, CopyGuard([*known, *screened])

    def logged_screen_size(self, batch_size: int) -> int:
        """As many as the validation set holds; a batch under a metric-call limit."""
        return batch_size if rollouts_left() is not None else max(batch_size, len(self.validation_examples()))

    def _note_copies(self, record: StepRecord) -> None:
        """After a step whose candidates quoted training examples, the LLM proposers are
        asked for general rules (until a step's candidates quote none)."""
        quoted = sorted({key for d in record.decisions for key in d.quoted})
        note = None
        if quoted:
            shown = ", ".join(quoted[:5]) + (f" and {len(quoted) - 5} more" if len(quoted) > 5 else "")
            note = (
                f"Earlier suggestions copied training examples into the parameters ({shown}). A value that "
                "quotes an example's input or expected answer gets no credit for that example: write general "
                "rules that fix inputs like these, never the examples themselves."
            )
        if quoted or record.decisions:
            self._set_copy_note(note)

    def _set_copy_note(self, note: str | None) -> None:
        self._copy_note = note
        for proposer in self.proposers:
            if isinstance(proposer, Optimizer):
                proposer.note = note

    async def _probe_noise(self, ctx: StepContext) -> None:
        """Before the first step: the check's noise probe, on the record; a noisy agent's
        candidates that win are measured again (`Validation.set_noise`)."""
        assert self.checker is not None
        for rollout in await self.checker.probe(self._runner(ctx)):
            ctx.emit(RolloutEvent(step=ctx.step, phase="probe", **rollout.to_record()))
        self._tell_noise()

    def _tell_noise(self) -> None:
        if self.checker is not None and self.checker.noise is not None:
            self.validation.set_noise(2 if self.checker.noise.noisy else 1)

    def _runner(self, ctx: StepContext) -> Runner:
        return Runner(agent=self.agent, guide=ctx.guide, executor=self.executor, min_score=ctx.min_score,
                      timeout=ctx.rollout_timeout)  # fmt: skip

    async def check_final(
        self, ctx: StepContext, start: dict[str, Any], final: dict[str, Any], fallback: dict[str, Any] | None
    ) -> tuple[FinalCheckResult, dict[str, Any]] | None:
        """The final check (`opto.search.FinalCheck`, run by `CheckPhase`): on the reserved
        examples, or on the training and validation examples again when none were reserved."""
        if self.checker is None:
            return None
        return await self.checker.check(
            self._runner(ctx),
            self.validation_examples(),
            start=start,
            final=final,
            fallback=fallback,
            guard=self._guard,
            search_score=self.search_score(),
            on_made=lambda found: self._record_check(found, ctx),
            # A check that kept no calls runs only within what a metric-call limit leaves.
            allowance=None if self.checker.settings.keep_calls else ctx.rollouts_left,
        )

    def _record_cut_short(self, ctx: StepContext) -> None:
        """The rollouts a stop left without a decision: the current values' measurements and
        the candidates' finished screening and validation rollouts."""
        for rollout in self.validation.take_current_rollouts():
            ctx.emit(RolloutEvent(step=ctx.step, phase="current", **rollout.to_record()))
        for phase, candidate_id, rollouts in self.validation.take_cut_short():
            for rollout in rollouts:
                ctx.emit(RolloutEvent(step=ctx.step, phase=phase, candidate_id=candidate_id, **rollout.to_record()))

    def _remember(self, rollouts: Sequence[Rollout]) -> None:
        """What the search measured of the values it moved through, for a check of a
        deterministic agent."""
        if self.checker is not None:
            self.checker.remember(rollouts)

    @staticmethod
    def _record_check(rollouts: list[Rollout], ctx: StepContext) -> None:
        for rollout in rollouts:
            ctx.emit(RolloutEvent(step=ctx.step, phase="final_check", **rollout.to_record()))

    def has_final_check(self) -> bool:
        return self.checker is not None

    def check_set(self) -> list[Example]:
        return list(self._check_examples)

    def reserved_calls(self) -> int:
        """The final check's first look: the start and the final values once on each of its
        examples (one call per rollout assumed). A noisy agent's second look and a fallback
        candidate come on top. None with `FinalCheck(keep_calls=False)`."""
        return self.checker.kept_calls(self.validation_examples()) if self.checker is not None else 0

    def check_rollouts(self) -> int:
        """The noise probe (its examples twice) and the final check's first look."""
        if self.checker is None:
            return 0
        return self.checker.probe_rollouts(made_too=True) + self.check_calls()

    def probe_rollouts(self) -> int:
        return self.checker.probe_rollouts() if self.checker is not None else 0

    def search_score(self) -> float | None:
        """The final values' score on the examples the search decided on (validation set,
        or batch): the pool's best mean with pool-based selection."""
        if self.selector.uses_pool and self.pool:
            return self.pool.best().mean
        return self._incumbent_score

    def _tell_scores(self, record: StepRecord) -> None:
        """Tell each proposer that learns from scores (`observe`, e.g. `TPEProposer`) the
        validation score of the candidate each of its proposals went into (None when the
        candidate was not scored on the whole validation set), and as `partial` its score
        where it was stopped before that (screened out on the batch, dropped in a race)."""
        learners = {p.name: p for p in self.proposers if hasattr(p, "observe")}
        if not learners:
            return
        whole: dict[str, float | None] = {}  # scores on the whole validation set
        part: dict[str, float | None] = {}  # scores on the batch or the raced part it was stopped at
        if isinstance(self.validation, DatasetValidation):
            for d in record.decisions:
                if d.candidate_id is not None:  # None: a step without candidates
                    (whole if d.stage in (None, "dataset") else part)[d.candidate_id] = d.candidate_score
        told: dict[str, float | None] = {}
        stopped: dict[str, float | None] = {}
        for event in record.events:
            if event.type == "candidate" and event.final:
                for proposal_id in event.source_proposals:
                    if told.get(proposal_id) is None:
                        told[proposal_id] = whole.get(event.candidate_id)
                    if stopped.get(proposal_id) is None:
                        stopped[proposal_id] = part.get(event.candidate_id)
        for event in record.events:
            if event.type == "proposal" and event.proposer in learners:
                pid = event.proposal_id
                learner = learners[event.proposer]
                if _takes_partial(learner):
                    learner.observe(pid, told.get(pid), partial=stopped.get(pid))
                else:  # a proposer of the user's written before `partial`
                    learner.observe(pid, told.get(pid))

    async def _rollouts_and_proposals(
        self,
        batch: list[Example],
        ctx: StepContext,
        logged_guide: LoggedGuide | None = None,
    ) -> tuple[list[Rollout], list[InstanceOutput]]:
        """The agent and guide on every example under the current values, and the proposers
        on each rollout as soon as it is judged: no instance waits for the slowest rollout.
        With `logged_guide`, the logged step's: production's outputs replayed and judged.

        Each instance's events are collected apart and added in batch order once all are
        in, so the ledger's order does not depend on which call came back first.
        """
        order = [e.id or "" for e in batch]  # unique: load_dataset refuses repeated ids
        instances: dict[str, tuple[StepContext, asyncio.Future[InstanceOutput]]] = {}

        once_a_step = self._batch_proposers()
        per_instance = [p for p in self.proposers if p not in once_a_step]

        def propose(rollout: Rollout) -> None:
            own = ctx.model_copy(update={"step_record": StepRecord(step=ctx.step, epoch=ctx.epoch)})
            instances[rollout.example_id] = (own, asyncio.ensure_future(self._propose(rollout, own, per_instance)))

        agent, guide = self.agent, ctx.guide
        if logged_guide is not None:  # production's outputs, judged here: no agent call
            agent, guide = ReplayAgent(self.agent, ctx.logged or []), logged_guide
        try:
            rollouts = await self.executor.run(
                agent, guide, batch, min_score=ctx.min_score, timeout=ctx.rollout_timeout, on_result=propose
            )
            self._record_rollouts(rollouts, ctx, "train" if logged_guide is None else "logged")
            if logged_guide is None:  # a replayed output reads no parameter
                self._warn_unread(rollouts, ctx.step)
            for rollout in rollouts:
                if rollout.example_id not in instances:  # an executor that does not report rollouts as they finish
                    propose(rollout)
            outputs = await gather_all(instances[key][1] for key in order)
        except BaseException:
            for _, future in instances.values():
                future.cancel()
            await asyncio.gather(*(future for _, future in instances.values()), return_exceptions=True)
            raise
        finally:  # what was proposed is recorded, also when the step stops
            for key in order:
                if key in instances:
                    for event in instances[key][0].step_record.events:  # type: ignore[union-attr]
                        ctx.emit(event)
        return rollouts, outputs

    async def _current_rollouts(self, batch: list[Example], ctx: StepContext) -> list[Rollout]:
        """The current values on `batch`, recorded as the step's training rollouts."""
        rollouts = await self.executor.run(
            self.agent, ctx.guide, batch, min_score=ctx.min_score, timeout=ctx.rollout_timeout
        )
        self._record_rollouts(rollouts, ctx, "train")
        return rollouts

    def _record_rollouts(self, rollouts: list[Rollout], ctx: StepContext, phase: str) -> None:
        """A step's own rollouts into its record; too many failed ones stop the run."""
        for rollout in rollouts:
            ctx.emit(RolloutEvent(step=ctx.step, phase=phase, **rollout.to_record()))
        if phase == "train":
            self._remember(rollouts)
        ctx.failure_log.note(rollouts, f"step {ctx.step}")
        check_failures(rollouts, ctx.max_failures, f"step {ctx.step}")

    def _batch_proposers(self) -> list[BatchProposer]:
        """The proposers asked once a step, in their order: in reflective mode every one
        that can be; in either mode those that only make sense once a step (`per_step`,
        e.g. `TPEProposer`)."""
        return [p for p in self.proposers if self.batching.once_a_step(p)]  # type: ignore[misc]

    async def _propose(
        self,
        rollout: Rollout,
        ctx: StepContext,
        proposers: Sequence[Proposer] | None = None,
    ) -> InstanceOutput:
        """Every (per-instance) proposer's proposals for one instance (a failed rollout gets none)."""
        proposers = self.proposers if proposers is None else proposers
        if rollout.failed:
            return InstanceOutput(rollout=rollout, error="the rollout failed; no proposal")
        results = await gather_all(
            self._ask(proposer, proposer.propose, rollout, rollout.example_id, ctx) for proposer in proposers
        )
        proposals = [p for found in results if found is not None for p in found]
        errors = [f"{proposer.name}: failed" for proposer, found in zip(proposers, results) if found is None]
        self._record(proposals, ctx)
        return InstanceOutput(rollout=rollout, proposals=proposals, error="; ".join(errors) or None)

    async def _propose_batch(self, rollouts: list[Rollout], ctx: StepContext) -> list[Proposal]:
        """The once-a-step proposers' proposals, each from the whole batch."""
        results = await gather_all(
            self._ask(proposer, proposer.propose_batch, rollouts, "", ctx) for proposer in self._batch_proposers()
        )
        proposals = [p for found in results if found is not None for p in found]
        self._record(proposals, ctx)
        return proposals

    def _record(self, proposals: list[Proposal], ctx: StepContext) -> None:
        for proposal in proposals:
            ctx.emit(ProposalEvent(step=ctx.step, **proposal.model_dump(mode="json")))
            if ctx.verbose and proposal.prompt_messages:
                _show(proposal.proposer, proposal.prompt_messages, proposal.raw_response)

    async def _ask(
        self,
        proposer: Proposer,
        method: Any,
        seen: Any,
        instance_id: str,
        ctx: StepContext,
    ) -> list[Proposal] | None:
        """One proposer's proposals (`method` of it on a rollout, or on the batch's rollouts);
        None when its model failed (recorded, the step goes on)."""
        parameters = self.agent.parameters()
        if self._focus is not None:
            parameters = focused(parameters, self._focus)
        try:
            async with self._loop_gate():
                return await method(parameters, seen)
        except BudgetExceeded:
            raise
        except LLMError as exc:
            logger.warning("%s failed on %s: %s", proposer.name, instance_id or "the batch", exc)
            ctx.emit(ProposalErrorEvent(step=ctx.step, instance_id=instance_id, proposer=proposer.name, error=str(exc)))
            return None

    async def _decide(
        self, rollouts: list[Rollout], proposals: list[Proposal], ctx: StepContext, guard: CopyGuard | None = None
    ) -> StepRecord:
        """Candidates from the proposals, a decision on each, and the best accepted one applied
        (`guard`: the copy guard when the rollouts hold examples the run's guard lacks)."""
        candidates = await self._candidates(proposals, ctx)
        usable = [c for c in candidates if c.update]
        if not usable:
            record = ctx.step_record or StepRecord(step=ctx.step, epoch=ctx.epoch)
            record.score = mean_score(rollouts)
            record.note = "no candidate: " + _why_none(proposals, candidates)
            ctx.emit(DecisionEvent(step=ctx.step, reason=record.note))
            return record
        return await self._judge(rollouts, usable, ctx, guard)

    async def _judge(
        self, rollouts: list[Rollout], usable: list[Candidate], ctx: StepContext, guard: CopyGuard | None = None
    ) -> StepRecord:
        """A decision on each candidate, and the best accepted one applied."""
        record = ctx.step_record or StepRecord(step=ctx.step, epoch=ctx.epoch)
        record.score = mean_score(rollouts)
        decisions = await self._decisions(usable, rollouts, ctx, guard)
        if self.selector.uses_pool:
            self._add_to_pool(usable, decisions, ctx)
        accepted = [(d, c) for d, c in zip(decisions, usable) if d.accepted]
        whole = [d for d in decisions if d.stage in (None, "dataset") and d.current_score is not None]
        if whole:
            self._incumbent_score = whole[0].current_score
        if not accepted:
            best = max(decisions, key=by_score)
            record.accepted, record.candidate_score, record.note = False, best.candidate_score, best.reason
            return record
        decision, winner = max(accepted, key=lambda pair: by_score(pair[0]))
        self._remember([*decision.screening_rollouts, *decision.rollouts])
        self.agent.apply(winner.update)
        self._incumbent_score = decision.candidate_score
        ctx.emit(AppliedEvent(step=ctx.step, candidate_id=winner.candidate_id, update=winner.update))
        record.accepted, record.candidate_score = True, decision.candidate_score
        record.update, record.note = winner.update, decision.reason
        return record

    async def _candidates(self, proposals: list[Proposal], ctx: StepContext) -> list[Candidate]:
        try:
            candidates = await self.candidate_source.candidates(self.agent.parameters(), proposals, ctx.stepsize)
        except BudgetExceeded:
            raise
        except LLMError as exc:
            logger.warning("step %d: aggregator failed, no update: %s", ctx.step, exc)
            ctx.emit(AggregateErrorEvent(step=ctx.step, error=str(exc)))
            return []
        for candidate in candidates:
            for group in candidate.groups if candidate.sample_index == 0 else []:
                ctx.emit(
                    CandidateEvent(step=ctx.step, final=False, **group.model_dump(mode="json", exclude={"groups"}))
                )
            ctx.emit(CandidateEvent(step=ctx.step, final=True, **candidate.model_dump(mode="json", exclude={"groups"})))
            if ctx.verbose:
                _show("aggregator", candidate.prompt_messages, candidate.raw_response)
        return candidates

    async def _decisions(
        self, candidates: list[Candidate], rollouts: list[Rollout], ctx: StepContext, guard: CopyGuard | None = None
    ) -> list[Decision]:
        batch = [Example(r.x, r.info, id=r.example_id) for r in rollouts]
        vctx = ValidationContext(
            agent=self.agent,
            guide=ctx.guide,
            batch=batch,
            current_rollouts=rollouts,
            min_score=ctx.min_score,
            executor=self.executor,
            improvement_threshold=self.improvement_threshold,
            rollout_timeout=ctx.rollout_timeout,
            guard=guard or self._guard,
        )
        # Candidates are validated at once; their events are added in candidate order.
        try:
            decisions = await gather_all(
                self.validation.decide(vctx, c.candidate_id, self.to_param_dict(c.update)) for c in candidates
            )
        except BaseException:  # a stop: what the decisions had paid for stays on the record
            self._record_cut_short(ctx)
            raise
        decisions = self.validation.across_candidates(decisions)
        if self.checker is not None:
            self.checker.note_compared(sum(d.candidate_score is not None for d in decisions))
        current = self.validation.take_current_rollouts()
        for rollout in current:
            ctx.emit(RolloutEvent(step=ctx.step, phase="current", **rollout.to_record()))
        self._remember(current)
        for candidate, decision in zip(candidates, decisions):
            self._note_reads(decision.rollouts)
            for rollout in decision.screening_rollouts:
                ctx.emit(
                    RolloutEvent(
                        step=ctx.step, phase="screening", candidate_id=candidate.candidate_id, **rollout.to_record()
                    )
                )
            for rollout in decision.rollouts:
                ctx.emit(
                    RolloutEvent(
                        step=ctx.step, phase="validation", candidate_id=candidate.candidate_id, **rollout.to_record()
                    )
                )
            ctx.emit(DecisionEvent(step=ctx.step, validation=self.validation.name, **decision.model_dump(mode="json")))
        return decisions

    async def _merge_step(self, batch: list[Example], plan: MergePlan, ctx: StepContext) -> StepRecord:
        """A step that validates the merge of two lineages instead of asking for proposals."""
        self._merges_tried.add(json_key(plan.values))
        parent = self.pool.get(plan.parent_id)
        assert parent is not None
        self.agent.apply(parent.values)
        ctx.emit(
            ParentEvent(step=ctx.step, candidate_id=parent.candidate_id, front=self.pool.front(), mean=parent.mean)
        )
        if ctx.step_record is not None:
            ctx.step_record.start_values = self.agent.stored_values()
        rollouts = await self._current_rollouts(batch, ctx)
        origin = "; ".join(f"{name} from {source}" for name, source in plan.taken_from.items())
        candidate = Candidate(
            update={k: v for k, v in plan.values.items() if v != parent.values.get(k)},
            reasoning=f"merge of {plan.parent_id} and {plan.other_id} (common ancestor {plan.ancestor_id}): {origin}",
            extraction_method="merge",
            merge_parents=[plan.parent_id, plan.other_id],
        )
        ctx.emit(CandidateEvent(step=ctx.step, final=True, **candidate.model_dump(mode="json", exclude={"groups"})))
        return await self._judge(rollouts, [candidate], ctx)

    # The budget check before the first step ------------------------------------------

    def calls_per_step(self, batch_size: int, most: bool = False) -> dict[str, int]:
        llm_proposers = [p for p in self.proposers if isinstance(p, Optimizer)]
        candidates = self.candidate_source.min_candidates if llm_proposers else 1
        once_a_step = self._batch_proposers()
        reflective = [p for p in llm_proposers if p in once_a_step]
        per_instance = len(llm_proposers) - len(reflective)
        proposals = batch_size * per_instance + len(reflective)
        if not most:
            validation = self.validation.rollouts_per_step(batch_size, candidates)
        else:  # every proposal a candidate of its own too; a noisy agent measures each `repeats` times
            candidates += proposals + len(self.proposers) - len(llm_proposers)
            repeats = self.final_check.repeats if self.final_check is not None else 1
            validation = repeats * self.validation.most_rollouts_per_step(batch_size, candidates)
        return {
            "rollouts": batch_size,
            "proposals": proposals,
            "aggregation": self.candidate_source.min_calls if per_instance else 0,
            "validation": validation,
        }

    def rollouts_to_accept(self, batch_size: int) -> int:
        return self.probe_rollouts() + batch_size + self.validation.most_rollouts_per_step(batch_size, 1)

    def check_calls(self, most: bool = False) -> int:
        return self.checker.calls(self.validation_examples(), most) if self.checker is not None else 0

    async def _measure_units(
        self, guide: Guide, sample: list[Example], given: dict[str, Any], options: dict[str, Any]
    ) -> tuple[dict[str, PerCall], list[str], list[Rollout]]:
        """The agent's rollout, then one proposal (reflective: on the sample together;
        per instance: on each sample rollout) and one aggregation of those proposals."""
        units, notes, rollouts = await super()._measure_units(guide, sample, given, options)
        optimizer = next((p for p in self.proposers if isinstance(p, Optimizer)), None)
        if optimizer is None:
            return units, notes, rollouts
        aggregating = self.calls_per_step(len(sample))["aggregation"] > 0
        for role, model in (("optimizer", optimizer.model), ("aggregator", self.aggregator.model)):
            found = given_per_call(given, role, model)
            if found is not None:
                units[role] = found
                notes.append(f"{role}: tokens given")
        if "optimizer" in units and ("aggregator" in units or not aggregating):
            return units, notes, rollouts
        rollouts = rollouts or (await self._sample_rollouts(guide, sample, options))[0]
        with meter_usage() as meter:
            if optimizer in self._batch_proposers() and not all(optimizer.went_right(r) for r in rollouts):
                proposals, asked = await optimizer.propose_batch(self.agent.parameters(), rollouts), 1
            else:  # per instance, or a sample without a failure (a reflective call is then not made)
                found_lists = [await optimizer.propose(self.agent.parameters(), r) for r in rollouts if not r.failed]
                proposals, asked = [p for found in found_lists for p in found], len(found_lists)
        if "optimizer" not in units:
            units["optimizer"] = per_unit(meter.by_model, asked, [optimizer.model])
            notes.append(f"optimizer: tokens of {asked} proposal call(s) on the sample")
        if aggregating and "aggregator" not in units:
            units["aggregator"], note = await self._measure_aggregation(proposals, units["optimizer"], options)
            notes.append(note)
        return units, notes, rollouts

    async def _measure_aggregation(
        self, proposals: list[Proposal], proposal: PerCall, options: dict[str, Any]
    ) -> tuple[PerCall, str]:
        """One aggregation of `proposals`, scaled to a full batch's: each further proposal
        adds about one proposal reply to the aggregator's prompt."""
        model = self.aggregator.model
        with meter_usage() as meter:
            await self.candidate_source.candidates(self.agent.parameters(), proposals, options["stepsize"])
        measured = per_unit(meter.by_model, 1, [model] if model is not None else [])
        if not measured.calls:
            return proposal, "aggregator: not called on the sample's proposals; a proposal call's tokens assumed"
        extra = max(0, options["batch_size"] * len(self.proposers) - len(proposals)) * proposal.completion_tokens
        scaled = measured.model_copy(update={"prompt_tokens": measured.prompt_tokens + extra})
        if scaled.usd is not None and model is not None and model.price is not None:
            scaled.usd += extra * model.price.input / 1_000_000
        return scaled, (
            f"aggregator: one call measured on {len(proposals)} proposals, its prompt grown by a proposal reply "
            f"for each of the {options['batch_size']} a full batch has"
        )

    def _validation_assumption(self, steps: int) -> str:
        counted = f"validation: {self.validation.name}, the rollouts it makes per step at the fewest"
        if isinstance(self.validation, MinibatchFirst):
            held = len(self.validation.examples)
            most = steps * held * self.candidate_source.min_candidates + held
            counted = (
                f"validation: each candidate on its batch; one that wins there is also raced on {held} held-out "
                f"examples, not counted here: at most {most:,} more rollouts over the run"
            )
        return (
            f"{counted}; every step assumed to have failures to propose for (a step whose batch went all right "
            "makes no proposal and validates nothing)"
        )

    def budget_users(self) -> list[tuple[str, Budget, set[str]]]:
        users = super().budget_users()
        for proposer in self.proposers:
            if isinstance(proposer, Optimizer) and proposer.model.budget is not None:
                users.append((f"{proposer.name}'s model {proposer.model.name!r}", proposer.model.budget, {"proposals"}))
        model = self.aggregator.model
        if model is not None and model.budget is not None:
            users.append((f"the aggregator's model {model.name!r}", model.budget, {"aggregation"}))
        return users

    # Pool-based selection -------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "incumbent_score": self._incumbent_score,
            "copy_note": self._copy_note,
            **(self.checker.state_dict() if self.checker is not None else {}),
        }
        learned = {p.name: p.state_dict() for p in self.proposers if hasattr(p, "state_dict")}
        if learned:
            state["proposers"] = learned
        if not self.selector.uses_pool:
            return state
        return {**state, "pool": self.pool.model_dump(mode="json"), "merges_tried": sorted(self._merges_tried)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.checker is not None:
            self.checker.load_state_dict(state)
        self._tell_noise()
        self._incumbent_score = state.get("incumbent_score")
        self._set_copy_note(state.get("copy_note"))
        self.pool = CandidatePool.model_validate({**state.get("pool", {}), "objectives": self.objectives})
        self._merges_tried = set(state.get("merges_tried", []))
        for proposer in self.proposers:
            if hasattr(proposer, "load_state_dict"):
                proposer.load_state_dict(state.get("proposers", {}).get(proposer.name, {}))

    def _start_from_the_pool(self, ctx: StepContext) -> None:
        """Apply the parent the selector draws with a generator seeded by (seed, step)."""
        parent = self.selector.parent(self.pool, np.random.default_rng([self._seed, ctx.step]))
        if parent is None:
            return
        self.agent.apply(parent.values)
        ctx.emit(
            ParentEvent(step=ctx.step, candidate_id=parent.candidate_id, front=self.pool.front(), mean=parent.mean)
        )

    def _add_to_pool(self, candidates: Sequence[Candidate], decisions: Sequence[Decision], ctx: StepContext) -> None:
        # Those validated on the whole set (not screened out by MinibatchFirst, nor dropped in a race).
        validated = [d for d in decisions if d.rollouts and d.stage != "race"]
        if not validated:
            return
        current = self.agent.stored_values(trainable_only=True)
        parent = self.pool.find(current)
        if parent is None:  # the first validation: the starting values join the pool
            parent = self.pool.add(
                START_ID if not self.pool else f"step{ctx.step}-start",
                current,
                validated[0].current_rollouts,
                step=ctx.step - 1,
                parent_id=None,
            )
            ctx.emit(PoolEvent(step=ctx.step, **parent.model_dump(mode="json"), pool_mean=parent.mean))
        for candidate, decision in zip(candidates, decisions):
            if decision in validated:
                self._remember(decision.rollouts)
                entry = self.pool.add(
                    candidate.candidate_id,
                    {**current, **candidate.update},
                    decision.rollouts,
                    step=ctx.step,
                    parent_id=parent.candidate_id,
                    merge_parent_id=candidate.merge_parents[1] if candidate.merge_parents else None,
                )
                ctx.emit(PoolEvent(step=ctx.step, **entry.model_dump(mode="json"), pool_mean=entry.mean))

    def final_values(self) -> dict[str, Any]:
        """The values the run would end with if it stopped now: with pool-based selection the
        pool's best mean, else the current values (greedy's incumbent)."""
        if self.selector.uses_pool and self.pool:
            return dict(self.pool.best().values)
        return self.agent.stored_values(trainable_only=True)

    def finish(self) -> bool:
        """Apply `final_values()` at the end of the run; True if they differ from the current."""
        final = self.final_values()
        if final == self.agent.stored_values(trainable_only=True):
            return False
        logger.info(
            "%s selection: the run ends with the pool's best, of validation mean %s",
            self.selection,
            self.pool.best().mean,
        )
        self.agent.apply(final)
        return True

    # Helpers ---------------------------------------------------------------------------

    def _warn_unread(self, rollouts: Sequence[Rollout], step: int) -> None:
        """Warn, once per run, about a trainable parameter that no rollout of the run has
        read yet: until one does, updates to it change nothing. Only what was observed is
        said, since an agent may read a parameter in some branches only."""
        ran = [r for r in rollouts if not r.failed]
        if not ran:
            return
        self._note_reads(ran)
        for param in self.agent.parameters(trainable_only=True):
            if param.name not in self._read and param.name not in self._unread_warned:
                self._unread_warned.add(param.name)  # type: ignore[arg-type]
                logger.warning(
                    "the trainable parameter %r was not read in step %d's rollouts (nor earlier in this "
                    "run): updates to it change nothing until the agent reads it (through .value inside "
                    "forward)",
                    param.name,
                    step,
                )

    def _note_reads(self, rollouts: Sequence[Rollout]) -> None:
        self._read.update(*(r.parameters_read for r in rollouts))

    def _loop_gate(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._gate is None or self._gate[0] is not loop:
            self._gate = (loop, asyncio.Semaphore(self.concurrency))
        return self._gate[1]


def _takes_partial(learner: Any) -> bool:
    """Whether a learner's `observe` takes `partial` (the score where a candidate stopped)."""
    parameters = inspect.signature(learner.observe).parameters
    return "partial" in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def _check_proposers(optimizer: Proposer | Sequence[Proposer]) -> list[Proposer]:
    proposers: list[Proposer] = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]  # type: ignore[list-item]
    if not proposers:
        raise OptoValueError("AggregatedUpdate needs at least one proposer, e.g. Optimizer(llm) or DemoProposer()")
    for proposer in proposers:
        if not isinstance(proposer, Proposer):
            raise OptoTypeError(
                f"{type(proposer).__name__} is not a proposer: it needs a name and "
                "async propose(parameters, rollout) -> list[Proposal] (e.g. Optimizer(llm), DemoProposer())"
            )
    names = [p.name for p in proposers]
    if len(set(names)) != len(names):
        raise OptoValueError(f"proposers need distinct names to tell their proposals apart in the ledger, got {names}")
    return proposers


def _why_none(proposals: Sequence[Proposal], candidates: Sequence[Candidate]) -> str:
    if not any(p.update for p in proposals):
        return "no proposal carried an update"
    if candidates and all(c.terminate for c in candidates):
        return "the aggregator asked for no change (TERMINATE)"
    errors = {c.error for c in candidates if c.error}
    return "; ".join(sorted(errors)) or "the aggregator produced no usable update"


def _show(role: str, messages: list[dict[str, Any]], reply: str) -> None:
    """verbose=True: print what was sent and received."""
    print(f"----- {role} prompt -----")
    for message in messages:
        print(f"[{message['role']}]\n{message['content']}")
    print(f"----- {role} reply -----\n{reply}\n")
