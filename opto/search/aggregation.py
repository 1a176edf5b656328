"""The aggregator: one LLM merges many proposals into candidate updates.

Changes to `Demos` parameters are merged by rule instead (no model call; see
`opto.search.demo_rules`) into a candidate of their own, validated like any other; a proposal
that changes demos and other parameters is split, and the LLM merges only the rest.

The current values are suggestion 0 with confidence `1 - stepsize`; each distinct
proposal has confidence `stepsize`. All of them go into one prompt whenever it fits
`max_prompt_tokens` (measured on the rendered prompt); only when it does not (or when a
`fan_in` count is set and exceeded) are they merged in groups and the group results
merged again, so the prompt stays bounded at any batch size.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from .._util.async_tools import gather_all
from .._util.files import json_key
from ..core.parameters import Demos, Parameter
from ..core.prompting import PromptTemplate
from ..core.schema import reply_format
from ..errors import OptoValueError, UsageError
from ..extraction import construct_update_dict, extract_llm_suggestion
from ..extraction.suggested import SuggestedUpdate
from ..llm.base import Model
from ..llm.usage import estimate_tokens
from .demo_rules import merge_demo_lists
from .proposers import JSON_MODE, Proposal, reply_tokens

__all__ = [
    "Aggregator",
    "Candidate",
    "construct_update_dict",
    "extract_llm_suggestion",
]

logger = logging.getLogger(__name__)


class Candidate(SuggestedUpdate):
    """One merged update proposed by the aggregator.

    `error` says why a reply gave nothing usable (unreadable even after the repair
    request, or truncated). `groups` holds the intermediate merges that led to it, when
    proposals were merged in groups.
    """

    candidate_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    level: int = 0
    repaired: bool = False
    error: str | None = None
    source_proposals: list[str] = Field(default_factory=list)
    groups: list[Candidate] = Field(default_factory=list)
    # A merge of two lineages (`merge_every`): the pool members it combines.
    merge_parents: list[str] = Field(default_factory=list)


class _Suggestion(BaseModel):
    update: dict[str, Any]
    reasoning: str = ""
    support: int = 1
    sources: list[str] = Field(default_factory=list)


def _part(proposal: Proposal, keep: Callable[[str], bool]) -> Proposal | None:
    """The proposal restricted to the parameters `keep` accepts (same id); None if that is nothing."""
    update = {name: value for name, value in proposal.update.items() if keep(name)}
    if update == proposal.update:
        return proposal if update else None
    return proposal.model_copy(update={"update": update}) if update else None


def dedupe(proposals: Sequence[Proposal]) -> list[_Suggestion]:
    """Identical updates are shown once, with how many instances proposed them."""
    merged: dict[str, _Suggestion] = {}
    for proposal in proposals:
        if not proposal.update:
            continue
        key = json_key(proposal.update)
        if key in merged:
            merged[key].support += 1
            merged[key].sources.append(proposal.proposal_id)
        else:
            merged[key] = _Suggestion(
                update=proposal.update, reasoning=proposal.reasoning, sources=[proposal.proposal_id]
            )
    return list(merged.values())


class Aggregator:
    """Merges proposals into `num_candidates` candidate updates.

    Args:
        model: the aggregator's LLM (None: only demo proposals can be merged, by rule).
        template: a `PromptTemplate`, or a user-message template (text or path) that
            replaces `prompts/aggregator.user.j2`.
        max_tokens: the reply's token limit; "auto" (the default) sizes it to the values
            merged (`opto.search.proposers.reply_tokens`: 256 tokens plus about twice the
            longest current or suggested value of each parameter, at most 2048).
        max_prompt_tokens: above this (estimated) prompt size, merge in groups.
        fan_in: at most this many suggestions in one prompt (None, the default: as many
            as fit `max_prompt_tokens`, so a step merges in one call whenever it can).
        num_candidates: samples of the final LLM merge; each is validated on its own. The
            rule merge of demo lists always gives one candidate (it is deterministic).
        temperature: sampling temperature (the backend's default when None).
        structured: ask for a JSON schema built from the parameters (constrained
            decoding where the backend supports it); False asks for plain JSON mode.
            A schema leaves no room for TERMINATE: "no change" is then the current
            values restated, which is dropped as a no-op all the same.
    """

    def __init__(
        self,
        model: Model | None,
        *,
        template: PromptTemplate | str | Path | None = None,
        max_tokens: int | str = "auto",
        max_prompt_tokens: int = 6000,
        fan_in: int | None = None,
        num_candidates: int = 1,
        temperature: float | None = None,
        structured: bool = True,
    ) -> None:
        if fan_in is not None and fan_in < 2:
            raise OptoValueError(f"fan_in must be >= 2, got {fan_in}")
        if num_candidates < 1:
            raise OptoValueError(f"num_candidates must be >= 1, got {num_candidates}")
        self.model = model
        self.template = PromptTemplate.resolve(template, "aggregator")
        self.repair_template = PromptTemplate.builtin("repair")
        self.max_tokens = max_tokens
        self.max_prompt_tokens = max_prompt_tokens
        self.fan_in = fan_in
        self.num_candidates = num_candidates
        self.temperature = temperature
        self.structured = structured

    def _format(self, params: Sequence[Parameter]) -> dict[str, Any]:
        if not self.structured:
            return JSON_MODE
        return reply_format(params, [f"reasoning_{p.name}" for p in params if p.trainable], "aggregate")

    @property
    def system_prompt(self) -> str:
        return self.template.render_system() or ""

    async def aggregate(
        self, current: Sequence[Parameter], proposals: Sequence[Proposal], stepsize: float
    ) -> list[Candidate]:
        """Candidates for this step; [] when no proposal carries an update (no call is made).

        Each proposal is split: its changes to trainable `Demos` parameters are merged by
        rule into one candidate (first, whatever `num_candidates`: a deterministic merge
        has nothing to sample), the rest go to the LLM, which never sees a demo list.
        """
        if not 0.0 <= stepsize <= 1.0:
            raise OptoValueError(f"stepsize must be within [0, 1], got {stepsize}")
        demo_names = {p.name for p in current if isinstance(p, Demos) and p.trainable}
        demo_parts = [part for p in proposals if (part := _part(p, lambda name: name in demo_names))]
        others = [part for p in proposals if (part := _part(p, lambda name: name not in demo_names))]
        rule = self._merge_demos(current, demo_parts)
        if not dedupe(others):
            return rule
        if self.model is None:
            raise OptoValueError(
                "the aggregator has no model, and some proposals change parameters other than Demos: give "
                "AggregatedUpdate an llm= (or an Aggregator with a model) to merge them"
            )
        return rule + await self._aggregate_with_llm(current, others, stepsize)

    def _merge_demos(self, current: Sequence[Parameter], proposals: Sequence[Proposal]) -> list[Candidate]:
        """One candidate: for each Demos parameter, the demos its proposals add, merged by rule."""
        if not proposals:
            return []
        update: dict[str, Any] = {}
        for param in current:
            if not isinstance(param, Demos):
                continue
            lists = [p.update[param.name] for p in proposals if param.name in p.update]
            if lists:
                merged = merge_demo_lists(param.stored_value, lists, param.max_demos)
                if merged != param.stored_value:
                    update[param.name] = merged  # type: ignore[index]
        if not update:
            return []
        sources = [p.proposal_id for p in proposals]
        return [
            Candidate(
                update=update,
                extraction_method="rule",
                source_proposals=sources,
                reasoning=f"demos merged by rule from {len(proposals)} proposals",
            )
        ]

    async def _aggregate_with_llm(
        self, current: Sequence[Parameter], proposals: Sequence[Proposal], stepsize: float
    ) -> list[Candidate]:
        # Demo lists are merged by rule: the LLM neither sees nor rewrites them.
        trainable = [p for p in current if p.trainable and not isinstance(p, Demos)]
        suggestions = dedupe(proposals)
        groups: list[Candidate] = []
        level = 0
        while len(suggestions) > 1 and not self._fits(trainable, suggestions, stepsize):
            level += 1
            batches = self._partition(trainable, suggestions, stepsize)
            merged = await gather_all(self._merge_group(trainable, batch, stepsize, level, groups) for batch in batches)
            suggestions = [s for s in merged if s is not None]
            logger.info("aggregation level %d: %d groups -> %d suggestions", level, len(batches), len(suggestions))
            if not suggestions:
                return []
        final = await self._merge(trainable, suggestions, stepsize, self.num_candidates, level + 1)
        for candidate in final:
            candidate.groups = list(groups)
        return final

    def _messages(self, params: Sequence[Parameter], suggestions: Sequence[_Suggestion], stepsize: float) -> list:
        return self.template.render(
            parameters=[p.describe() for p in params],
            current={p.name: p.value for p in params},
            current_confidence=1.0 - stepsize,
            suggestions=[{**s.model_dump(), "confidence": stepsize} for s in suggestions],
        )

    def _prompt_tokens(self, params: Sequence[Parameter], suggestions: Sequence[_Suggestion], stepsize: float) -> int:
        return sum(estimate_tokens(m["content"]) for m in self._messages(params, suggestions, stepsize))

    def _fits(self, params: Sequence[Parameter], suggestions: Sequence[_Suggestion], stepsize: float) -> bool:
        if self.fan_in is not None and len(suggestions) > self.fan_in:
            return False
        return self._prompt_tokens(params, suggestions, stepsize) <= self.max_prompt_tokens

    def _partition(
        self, params: Sequence[Parameter], suggestions: Sequence[_Suggestion], stepsize: float
    ) -> list[list[_Suggestion]]:
        """Greedy groups within both bounds; a group of one passes to the next level as is."""
        batches: list[list[_Suggestion]] = [[]]
        for suggestion in suggestions:
            batch = batches[-1]
            if batch and not self._fits(params, [*batch, suggestion], stepsize):
                batches.append([suggestion])
            else:
                batch.append(suggestion)
        if len(batches) == len(suggestions):
            # Every suggestion alone is over the token bound: pair them so each level shrinks.
            batches = [list(suggestions[i : i + 2]) for i in range(0, len(suggestions), 2)]
        return batches

    async def _merge_group(
        self,
        params: Sequence[Parameter],
        batch: list[_Suggestion],
        stepsize: float,
        level: int,
        groups: list[Candidate],
    ) -> _Suggestion | None:
        """One intermediate merge (recorded in `groups`); None when it gave no update."""
        if len(batch) == 1:
            return batch[0]
        candidate = (await self._merge(params, batch, stepsize, 1, level))[0]
        groups.append(candidate)
        if not candidate.update:
            return None
        return _Suggestion(
            update=candidate.update,
            reasoning=candidate.reasoning,
            support=sum(s.support for s in batch),
            sources=[src for s in batch for src in s.sources],
        )

    async def _merge(
        self, params: Sequence[Parameter], suggestions: Sequence[_Suggestion], stepsize: float, n: int, level: int
    ) -> list[Candidate]:
        messages = self._messages(params, suggestions, stepsize)
        budget = self._reply_tokens(params, suggestions)
        completion = await self._model().complete(
            messages, response_format=self._format(params), temperature=self.temperature, max_tokens=budget, n=n
        )
        sources = [src for s in suggestions for src in s.sources]
        candidates = []
        for index, text in enumerate(completion.texts):
            candidate = await self._read(params, messages, text, completion.truncated, budget)
            candidate.sample_index, candidate.level, candidate.source_proposals = index, level, sources
            candidates.append(candidate)
        return candidates

    def _reply_tokens(self, params: Sequence[Parameter], suggestions: Sequence[_Suggestion]) -> int:
        if self.max_tokens != "auto":
            return self.max_tokens  # type: ignore[return-value]
        return reply_tokens([p for p in params if p.trainable], [s.update for s in suggestions])

    def _model(self) -> Model:
        if self.model is None:  # only demo lists are merged without a model, and never by a call
            raise UsageError("this Aggregator has no model to merge suggestions with")
        return self.model

    async def _read(
        self, params: Sequence[Parameter], messages: list, text: str, truncated: bool, max_tokens: int
    ) -> Candidate:
        """Read a candidate; an unreadable or truncated reply gets one repair request."""
        candidate = Candidate.read(params, text, messages)
        if truncated or candidate.unreadable:
            repair = [
                *messages,
                {"role": "assistant", "content": text},
                {"role": "user", "content": self.repair_template.render_user(truncated=truncated)},
            ]
            logger.warning("aggregator reply %s; asking once more", "was truncated" if truncated else "was unreadable")
            retry = await self._model().complete(
                repair,
                response_format=self._format(params),
                temperature=self.temperature,
                max_tokens=max_tokens,
            )
            truncated = retry.truncated
            candidate = Candidate.read(params, retry.text, repair, repaired=True)  # the context of the kept text
        if truncated:
            # A value cut mid-way must never be applied as if it were whole.
            return Candidate(
                raw_response=candidate.raw_response,
                prompt_messages=candidate.prompt_messages,
                repaired=candidate.repaired,
                error="reply truncated at max_tokens, even after a repair request",
            )
        if candidate.unreadable:
            return Candidate(
                raw_response=candidate.raw_response,
                prompt_messages=candidate.prompt_messages,
                repaired=candidate.repaired,
                error="no suggestion could be extracted, even after a repair request",
            )
        return candidate
