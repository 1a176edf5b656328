"""The per-instance optimizer: one LLM call per rollout, proposing a parameter update."""

from __future__ import annotations

import json
from dataclasses import asdict
import logging
import re
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from .extraction import construct_update, extract_with_method
from .llm.base import Model
from .parameters import Parameter
from .prompting import PromptTemplate
from .rollout import Rollout
from .schema import reply_format

__all__ = ["Optimizer", "Proposal", "reasoning_of"]

logger = logging.getLogger(__name__)

JSON_MODE = {"type": "json_object"}


class Proposal(BaseModel):
    """One suggested update, with everything needed to audit it or learn from it.

    `update` holds only values that parse, fit their parameter and differ from the
    current value; what was dropped, and why, is in `skipped`.
    """

    proposal_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:12])
    instance_id: str = ""
    sample_index: int = 0
    update: dict[str, Any] = Field(default_factory=dict)
    reasoning: str = ""
    raw_response: str = ""
    prompt_messages: list[dict[str, Any]] = Field(default_factory=list)
    extraction_method: str | None = None
    terminate: bool = False
    skipped: list[dict[str, Any]] = Field(default_factory=list)
    truncated: bool = False

    @property
    def unreadable(self) -> bool:
        """Nothing could be read from the reply (not even a "no change")."""
        return self.extraction_method is None and not self.terminate


class Optimizer:
    """Asks an LLM, for one rollout, how the parameters should change.

    Args:
        model: the optimizer's LLM.
        template: a `PromptTemplate`, or a user-message template (text or path) that
            replaces `prompts/optimizer.user.j2`.
        num_proposals: samples per instance (n); more than one makes preference data.
        temperature: sampling temperature (the backend's default when None).
        max_tokens: the reply's token limit.
        structured: ask for a JSON schema built from the parameters (constrained
            decoding where the backend supports it); False asks for plain JSON mode.

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
    ) -> None:
        if num_proposals < 1:
            raise ValueError(f"num_proposals must be >= 1, got {num_proposals}")
        self.model = model
        self.template = PromptTemplate.resolve(template, "optimizer")
        self.num_proposals = num_proposals
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.structured = structured

    def build_messages(self, parameters: Sequence[Parameter], instance: Rollout) -> list[dict[str, str]]:
        return self.template.render(
            parameters=[p.describe() for p in parameters],
            x=instance.x,
            trace=instance.trace,
            output=instance.output,
            score=instance.score,
            feedback=instance.feedback,
        )

    async def propose(self, parameters: Sequence[Parameter], instance: Rollout) -> list[Proposal]:
        """One proposal per sample; an unreadable reply gives a proposal with an empty update."""
        messages = self.build_messages(parameters, instance)
        completion = await self.model.complete(
            messages,
            response_format=reply_format(parameters, ["reasoning"], "proposal") if self.structured else JSON_MODE,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            n=self.num_proposals,
        )
        proposals = []
        for index, text in enumerate(completion.texts):
            extraction = extract_with_method(text)
            result = construct_update(parameters, extraction.suggestion)
            proposals.append(
                Proposal(
                    instance_id=instance.example_id,
                    sample_index=index,
                    update=result.update,
                    reasoning=reasoning_of(text),
                    raw_response=text,
                    prompt_messages=messages,
                    extraction_method=extraction.method,
                    terminate=extraction.terminate,
                    skipped=[asdict(s) for s in result.skipped],
                    truncated=completion.truncated,
                )
            )
        return proposals


_REASONING = re.compile(r'"(reasoning(?:_[\w.\-]+)?)"\s*:\s*("(?:[^"\\]|\\.)*")', re.DOTALL)


def reasoning_of(text: str) -> str:
    """The reasoning fields of a reply ("reasoning", "reasoning_<name>"), joined; '' if none."""
    parts = []
    for key, quoted in _REASONING.findall(text):
        try:
            value = json.loads(quoted)
        except json.JSONDecodeError:
            value = quoted.strip('"')
        parts.append(value if key == "reasoning" else f"{key[len('reasoning_'):]}: {value}")
    return "\n".join(parts)
