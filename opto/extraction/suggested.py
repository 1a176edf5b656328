"""What a model suggested: the fields `Proposal` and `Candidate` share, and how a reply
becomes them (extraction, then coercion and validation), in one place."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from pydantic import BaseModel, Field
from typing_extensions import Self

from ..core.parameters import Parameter
from . import construct_update, extract_with_method

__all__ = ["SuggestedUpdate", "reasoning_of"]


class SuggestedUpdate(BaseModel):
    """A suggested update with everything needed to audit it or learn from it.

    `update` holds only values that parse, fit their parameter and differ from the
    current value; what was dropped, and why, is in `skipped`. `terminate` is True when
    the model asked for no change.
    """

    sample_index: int = 0
    update: dict[str, Any] = Field(default_factory=dict)
    reasoning: str = ""
    raw_response: str = ""
    prompt_messages: list[dict[str, Any]] = Field(default_factory=list)
    extraction_method: str | None = None
    skipped: list[dict[str, Any]] = Field(default_factory=list)
    terminate: bool = False

    @property
    def unreadable(self) -> bool:
        """Nothing could be read from the reply (not even a "no change")."""
        return self.extraction_method is None and not self.terminate

    @classmethod
    def read(cls, parameters: Sequence[Parameter], text: str, messages: list[dict[str, Any]], **fields: Any) -> Self:
        """The suggestion in a model's reply to `messages`, checked against `parameters`."""
        extraction = extract_with_method(text)
        result = construct_update(parameters, extraction.suggestion)
        return cls(
            update=result.update,
            reasoning=reasoning_of(text),
            raw_response=text,
            prompt_messages=messages,
            extraction_method=extraction.method,
            terminate=extraction.terminate,
            skipped=[asdict(s) for s in (*extraction.skipped, *result.skipped)],
            **fields,
        )


_REASONING = re.compile(r'"(reasoning(?:_[\w.\-]+)?)"\s*:\s*("(?:[^"\\]|\\.)*")', re.DOTALL)


def reasoning_of(text: str) -> str:
    """The reasoning fields of a reply ("reasoning", "reasoning_<name>"), joined; '' if none."""
    parts = []
    for key, quoted in _REASONING.findall(text):
        try:
            value = json.loads(quoted)
        except json.JSONDecodeError:
            value = quoted.strip('"')
        parts.append(value if key == "reasoning" else f"{key[len('reasoning_') :]}: {value}")
    return "\n".join(parts)
