"""Proposers: per instance, suggest parameter updates.

`Proposer` is the protocol; `Optimizer` asks an LLM (one call per rollout), and
`DemoProposer` adds the instance to a `Demos` parameter (no model call).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import Field

from .llm.base import Model
from .llm.tracing import bounded_trace
from .demo_rules import add_demo, shows_input
from .parameters import Demos, Parameter, ParameterError
from .prompting import PromptTemplate
from .rollout import Rollout
from .schema import reply_format
from .suggested import SuggestedUpdate, reasoning_of

__all__ = ["DemoProposer", "Optimizer", "Proposal", "Proposer", "reasoning_of"]

logger = logging.getLogger(__name__)

JSON_MODE = {"type": "json_object"}


class Proposal(SuggestedUpdate):
    """One proposer's suggested update for one instance (`proposer` names who made it)."""

    proposal_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    proposer: str = "optimizer"
    instance_id: str = ""
    truncated: bool = False


@runtime_checkable
class Proposer(Protocol):
    """Suggests updates for one rollout. `propose` must keep no shared mutable state, as
    the trainer calls it for many instances at once; `name` labels its proposals."""

    name: str

    async def propose(self, parameters: Sequence[Parameter], rollout: Rollout) -> list[Proposal]:
        """Zero or more proposals for this rollout (an empty list: nothing to suggest)."""
        ...


class Optimizer:
    """Asks an LLM, for one rollout, how the parameters should change.

    `Demos` parameters are shown to it as fixed context and never proposed by it (demo
    lists change by rule, through `DemoProposer`); with nothing else trainable it makes
    no call.

    Args:
        model: the optimizer's LLM.
        template: a `PromptTemplate`, or a user-message template (text or path) that
            replaces `prompts/optimizer.user.j2`.
        num_proposals: samples per instance (n); more than one makes preference data.
        temperature: sampling temperature (the backend's default when None).
        max_tokens: the reply's token limit.
        structured: ask for a JSON schema built from the parameters (constrained
            decoding where the backend supports it); False asks for plain JSON mode.
        name: labels its proposals in the ledger.
        max_trace_chars: about how much of the agent's trace (its model calls, tool calls
            and tool results) the prompt shows; a longer trace is cut in the middle with
            a note saying what was left out.

    It keeps no state between calls, so any number of `propose` calls run at once.
    """

    def __init__(
        self,
        model: Model,
        *,
        template: PromptTemplate | str | Path | None = None,
        num_proposals: int = 1,
        temperature: float | None = None,
        max_tokens: int | None = 2048,
        structured: bool = True,
        name: str = "optimizer",
        max_trace_chars: int = 24_000,
    ) -> None:
        if num_proposals < 1:
            raise ValueError(f"num_proposals must be >= 1, got {num_proposals}")
        if max_trace_chars < 1:
            raise ValueError(f"max_trace_chars must be >= 1, got {max_trace_chars}")
        self.model = model
        self.template = PromptTemplate.resolve(template, "optimizer")
        self.num_proposals = num_proposals
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.structured = structured
        self.name = name
        self.max_trace_chars = max_trace_chars

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
        if not editable:
            return []
        messages = self.build_messages(parameters, instance)
        completion = await self.model.complete(
            messages,
            response_format=reply_format(editable, ["reasoning"], "proposal") if self.structured else JSON_MODE,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            n=self.num_proposals,
        )
        return [
            Proposal.read(editable, text, messages, proposer=self.name, instance_id=instance.example_id,
                          sample_index=index, truncated=completion.truncated)
            for index, text in enumerate(completion.texts)
        ]


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
    raise ValueError(
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
    one (see `opto.demo_rules`: outputs are kept balanced); an example already shown is
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
            raise ValueError(f"source must be 'labels', 'successes' or 'both', got {source!r}")
        if max_demos is not None and (isinstance(max_demos, bool) or not isinstance(max_demos, int) or max_demos < 1):
            raise ValueError(f"max_demos must be an int >= 1 or None, got {max_demos!r}")
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
        targets = [p for p in parameters if isinstance(p, Demos) and p.trainable
                   and (self.target is None or p.name == self.target)]
        if self.target is not None and not targets:
            raise ValueError(f"DemoProposer(target={self.target!r}): the agent has no trainable Demos of that name")
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
        return [Proposal(proposer=self.name, instance_id=rollout.example_id, update=update,
                         reasoning=f"add example {rollout.example_id!r} as a demo, with {why}",
                         extraction_method="rule")]
