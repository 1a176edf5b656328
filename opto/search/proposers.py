"""Proposers: suggest parameter updates, per instance or from a step's batch.

`Proposer` is the protocol; `Optimizer` asks an LLM, either one call per rollout
(`propose`) or one reflective call that sees a batch's failures together
(`propose_batch`, a `BatchProposer`); `DemoProposer` adds the instance to a `Demos`
parameter (no model call).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import Field

from ..core.parameters import Demos, Parameter, ParameterError
from ..core.prompting import PromptTemplate
from ..core.rollout import Rollout
from ..core.schema import reply_format
from ..errors import OptoValueError
from ..extraction.suggested import SuggestedUpdate, reasoning_of
from ..llm.base import Model
from ..llm.tracing import bounded_trace
from .demo_rules import add_demo, shows_input

__all__ = ["BatchProposer", "DemoProposer", "Optimizer", "Proposal", "Proposer", "reasoning_of"]

logger = logging.getLogger(__name__)

JSON_MODE = {"type": "json_object"}


class Proposal(SuggestedUpdate):
    """One proposer's suggested update for one instance (`proposer` names who made it)."""

    proposal_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    proposer: str = "optimizer"
    instance_id: str = ""
    # A reflective proposal: every rollout its prompt showed (`instance_id` is the first).
    instance_ids: list[str] = Field(default_factory=list)
    truncated: bool = False


@runtime_checkable
class Proposer(Protocol):
    """Suggests updates for one rollout. `propose` must keep no shared mutable state, as
    the trainer calls it for many instances at once; `name` labels its proposals."""

    name: str

    async def propose(self, parameters: Sequence[Parameter], rollout: Rollout) -> list[Proposal]:
        """Zero or more proposals for this rollout (an empty list: nothing to suggest)."""
        ...


@runtime_checkable
class BatchProposer(Proposer, Protocol):
    """A proposer that can also look at a step's rollouts together (reflective proposals)."""

    async def propose_batch(self, parameters: Sequence[Parameter], rollouts: Sequence[Rollout]) -> list[Proposal]:
        """Zero or more proposals from the batch (an empty list: nothing to fix)."""
        ...


class Optimizer:
    """Asks an LLM how the parameters should change: for one rollout (`propose`), or for a
    step's batch at once (`propose_batch`, the reflective mode `AggregatedUpdate` uses by
    default), which shows the batch's failures together with a few successes for contrast.

    `Demos` parameters are shown to it as fixed context and never proposed by it (demo
    lists change by rule, through `DemoProposer`); with nothing else trainable it makes
    no call.

    Args:
        model: the optimizer's LLM.
        template: a `PromptTemplate`, or a user-message template (text or path) that
            replaces `prompts/optimizer.user.j2`.
        num_proposals: samples per instance (n); more than one makes preference data.
        temperature: sampling temperature (the backend's default when None).
        max_tokens: the reply's token limit; "auto" (the default) scales it to the text
            being rewritten: 256 tokens for the reasoning and JSON, plus about twice the
            current values' length (in tokens, at 4 characters each), at most 2048. A small
            local model that loops then stops in seconds, not minutes.
        structured: ask for a JSON schema built from the parameters (constrained
            decoding where the backend supports it); False asks for plain JSON mode.
        name: labels its proposals in the ledger.
        max_trace_chars: about how much of the agent's trace (its model calls, tool calls
            and tool results) the prompt shows; a longer trace is cut in the middle with
            a note saying what was left out. A reflective prompt shares it among its examples.
        reflect_template: replaces `prompts/reflect.user.j2` (the reflective prompt).
        max_examples: the most failures a reflective prompt shows (the rest are counted).
        successes: how many rollouts that went right a reflective prompt adds for contrast.
        perfect_score: a rollout scoring at least this went right: it needs no proposal.
        skip_perfect: per instance too, make no call for a rollout that went right.

    It keeps no state between calls, so any number of `propose` calls run at once.
    """

    def __init__(
        self,
        model: Model,
        *,
        template: PromptTemplate | str | Path | None = None,
        num_proposals: int = 1,
        temperature: float | None = None,
        max_tokens: int | str | None = "auto",
        structured: bool = True,
        name: str = "optimizer",
        max_trace_chars: int = 24_000,
        reflect_template: PromptTemplate | str | Path | None = None,
        max_examples: int = 8,
        successes: int = 1,
        perfect_score: float = 1.0,
        skip_perfect: bool = False,
    ) -> None:
        if num_proposals < 1:
            raise OptoValueError(f"num_proposals must be >= 1, got {num_proposals}")
        if max_tokens != "auto" and max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise OptoValueError(f'max_tokens must be "auto", an int >= 1 or None, got {max_tokens!r}')
        if max_trace_chars < 1:
            raise OptoValueError(f"max_trace_chars must be >= 1, got {max_trace_chars}")
        if max_examples < 1:
            raise OptoValueError(f"max_examples must be >= 1, got {max_examples}")
        if successes < 0:
            raise OptoValueError(f"successes must be >= 0, got {successes}")
        self.model = model
        self.template = PromptTemplate.resolve(template, "optimizer")
        self.num_proposals = num_proposals
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.structured = structured
        self.name = name
        self.max_trace_chars = max_trace_chars
        self.reflect_template = PromptTemplate.resolve(reflect_template, "reflect")
        self.max_examples = max_examples
        self.successes = successes
        self.perfect_score = perfect_score
        self.skip_perfect = skip_perfect
        # Said at the end of every prompt while set (the trainer sets it when candidates
        # quoted training examples: `opto.search.copies`).
        self.note: str | None = None

    def went_right(self, rollout: Rollout) -> bool:
        return not rollout.failed and rollout.score is not None and rollout.score >= self.perfect_score

    def build_messages(self, parameters: Sequence[Parameter], instance: Rollout) -> list[dict[str, str]]:
        return self.template.render(
            parameters=[{**p.describe(), "trainable": _editable(p)} for p in parameters],
            x=instance.x,
            trace=bounded_trace(instance.trace, self.max_trace_chars),
            output=instance.output,
            score=instance.score,
            feedback=instance.feedback,
        )

    async def propose(self, parameters: Sequence[Parameter], instance: Rollout) -> list[Proposal]:
        """One proposal per sample; an unreadable reply gives a proposal with an empty update."""
        editable = [p for p in parameters if _editable(p)]
        if not editable or (self.skip_perfect and self.went_right(instance)):
            return []
        return await self._ask(editable, self.build_messages(parameters, instance), [instance.example_id], [])

    def build_batch_messages(
        self,
        parameters: Sequence[Parameter],
        rollouts: Sequence[Rollout],
    ) -> tuple[list[dict[str, str]], list[Rollout]]:
        """The reflective prompt for a batch, and the rollouts it shows (failures first)."""
        failures = [r for r in rollouts if not self.went_right(r)]
        shown = failures[: self.max_examples]
        right = [r for r in rollouts if self.went_right(r)][: self.successes]
        examples = [*shown, *right]
        share = max(1, self.max_trace_chars // max(1, len(examples)))
        messages = self.reflect_template.render(
            parameters=[{**p.describe(), "trainable": _editable(p)} for p in parameters],
            examples=[
                {
                    "x": r.x,
                    "trace": bounded_trace(r.trace, share),
                    "output": r.output,
                    "score": r.score,
                    "feedback": r.feedback,
                    "success": self.went_right(r),
                }
                for r in examples
            ],
            omitted=len(failures) - len(shown),
        )
        return messages, examples

    async def propose_batch(self, parameters: Sequence[Parameter], rollouts: Sequence[Rollout]) -> list[Proposal]:
        """Reflective: one call that sees the batch's failures together (no call when every
        rollout went right); each proposal names the rollouts it saw."""
        editable = [p for p in parameters if _editable(p)]
        if not editable or all(self.went_right(r) for r in rollouts):
            return []
        messages, shown = self.build_batch_messages(parameters, rollouts)
        seen = [r.example_id for r in shown]
        return await self._ask(editable, messages, seen, seen)

    async def _ask(
        self, editable: list[Parameter], messages: list[dict[str, str]], instance: list[str], seen: list[str]
    ) -> list[Proposal]:
        if self.note:
            messages = [
                *messages[:-1],
                {**messages[-1], "content": f"{messages[-1]['content']}\n\n# Note\n{self.note}"},
            ]
        completion = await self.model.complete(
            messages,
            response_format=reply_format(editable, ["reasoning"], "proposal") if self.structured else JSON_MODE,
            temperature=self.temperature,
            max_tokens=reply_tokens(editable) if self.max_tokens == "auto" else self.max_tokens,  # type: ignore[arg-type]
            n=self.num_proposals,
        )
        return [
            Proposal.read(
                editable,
                text,
                messages,
                proposer=self.name,
                instance_id=instance[0],
                instance_ids=seen,
                sample_index=index,
                truncated=completion.truncated,
            )
            for index, text in enumerate(completion.texts)
        ]


def reply_tokens(editable: Sequence[Parameter], suggested: Sequence[dict[str, Any]] = ()) -> int:
    """The "auto" token limit of a reply rewriting `editable`: room for the reasoning and
    the JSON around the values, and each value rewritten up to about twice the length of
    the longest of its current and `suggested` values (at about 4 characters a token)."""
    characters = sum(
        max([len(str(p.value)), *(len(str(update[p.name])) for update in suggested if p.name in update)])
        for p in editable
    )
    return min(2048, 256 + characters // 2)


def _editable(param: Parameter) -> bool:
    """What the LLM optimizer may change: trainable parameters other than demo lists."""
    return param.trainable and not isinstance(param, Demos)


def default_label(x: Any, info: Any) -> Any:
    """The demo output for an example: its info when that is a str, else the first
    accepted answer of a list of them."""
    if isinstance(info, str):
        return info
    if isinstance(info, (list, tuple)) and info and isinstance(info[0], str):
        return info[0]
    raise OptoValueError(
        f"DemoProposer cannot make a demo output from info {info!r}: give label=lambda x, info: ... "
        "returning the answer the demo should show"
    )


class DemoProposer:
    """Proposes adding the rollout's example to the agent's `Demos` parameters.

    Args:
        label: `label(x, info) -> output` turns an example's info into the demo's output
            (default: the info string, or the first accepted answer of a list).
        source: "labels" (the input with its label), "successes" (the input with the
            agent's own output, only when it scored `max_score`), or "both" (the success
            when there is one, else the label).
        max_demos: None keeps each `Demos` parameter's own `max_demos`; an int lowers it
            for the lists this proposer proposes. The aggregator's rule merge knows only
            `Demos.max_demos`, so to cap the list that training keeps, set that.
        target: the name of the `Demos` parameter to fill (None: every one).
        max_score: the score of a success.
        name: labels its proposals in the ledger.

    It makes no model call. A full list gets the new demo in place of the least useful
    one (see `opto.search.demo_rules`: outputs are kept balanced); an example already shown is
    not proposed again.
    """

    def __init__(
        self,
        label: Callable[[Any, Any], Any] | None = None,
        *,
        source: str = "labels",
        max_demos: int | None = None,
        target: str | None = None,
        max_score: float = 1.0,
        name: str = "demos",
    ) -> None:
        if source not in ("labels", "successes", "both"):
            raise OptoValueError(f"source must be 'labels', 'successes' or 'both', got {source!r}")
        if max_demos is not None and (isinstance(max_demos, bool) or not isinstance(max_demos, int) or max_demos < 1):
            raise OptoValueError(f"max_demos must be an int >= 1 or None, got {max_demos!r}")
        self.label = label or default_label
        self.source = source
        self.max_demos = max_demos
        self.target = target
        self.max_score = max_score
        self.name = name

    def _output(self, rollout: Rollout) -> tuple[Any, str] | None:
        succeeded = not rollout.failed and rollout.score is not None and rollout.score >= self.max_score
        if self.source in ("successes", "both") and succeeded:
            return rollout.output, "its own output, which scored the maximum"
        if self.source in ("labels", "both"):
            return self.label(rollout.x, rollout.info), "its label"
        return None

    async def propose(self, parameters: Sequence[Parameter], rollout: Rollout) -> list[Proposal]:
        targets = [
            p
            for p in parameters
            if isinstance(p, Demos) and p.trainable and (self.target is None or p.name == self.target)
        ]
        if self.target is not None and not targets:
            raise OptoValueError(f"DemoProposer(target={self.target!r}): the agent has no trainable Demos of that name")
        found = self._output(rollout) if targets else None
        if found is None:
            return []
        output, why = found
        new = {"input": rollout.x, "output": output}
        update: dict[str, Any] = {}
        for param in targets:
            limit = min(param.max_demos, self.max_demos or param.max_demos)
            shown = param.value
            if shows_input(shown, new["input"]):
                continue  # checked on the whole list, also past this proposer's limit
            demos = add_demo(shown[:limit], new, limit)
            if demos is None or demos == shown:
                continue
            try:
                param.validate(demos)
            except ParameterError as exc:  # e.g. an input JSON cannot hold
                logger.info("demo from %s not proposed: %s", rollout.example_id, exc)
                continue
            update[param.name] = demos  # type: ignore[index]
        if not update:
            return []
        return [
            Proposal(
                proposer=self.name,
                instance_id=rollout.example_id,
                update=update,
                reasoning=f"add example {rollout.example_id!r} as a demo, with {why}",
                extraction_method="rule",
            )
        ]
