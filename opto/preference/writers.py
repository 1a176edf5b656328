"""Writers: preference pairs (or best responses) -> JSONL records of one format.

Each writer turns items into records, validates every record against its format's schema
(`opto.preference.schemas`) and writes the file atomically. Pick one by name with
`get_writer("openai-dpo" | "openai-sft" | "trl" | "trl-chat" | "nemo")`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from .._io import atomic_write_jsonl
from .pairs import PreferencePair, SupervisedExample
from .schemas import FORMATS, validate_record

__all__ = [
    "NeMoWriter",
    "OpenAIDPOWriter",
    "OpenAISFTWriter",
    "TRLChatWriter",
    "TRLWriter",
    "Writer",
    "get_writer",
    "render_prompt_text",
]


def render_prompt_text(messages: Sequence[dict[str, Any]]) -> str:
    """A message list as one plain-text prompt, for formats that take a string.

    Each message becomes ``"<Role>: <content>"``, separated by blank lines, and the text
    ends with ``"Assistant:"`` and a newline, where the response begins.
    """
    blocks = [f"{str(m['role']).capitalize()}: {m['content']}" for m in messages]
    return "\n\n".join([*blocks, "Assistant:"]) + "\n"


def _messages(prompt: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    return [{"role": m["role"], "content": m["content"]} for m in prompt]


def _assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


class Writer:
    """Base class: `to_record` builds one record; `records` and `write` validate each."""

    format: ClassVar[str]
    kind: ClassVar[Literal["pairs", "supervised"]] = "pairs"

    def to_record(self, item: Any) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def records(self, items: Sequence[Any]) -> list[dict[str, Any]]:
        """Every item as a validated record (`DatasetFormatError` names the first bad one)."""
        expected = SupervisedExample if self.kind == "supervised" else PreferencePair
        records = []
        for index, item in enumerate(items):
            if not isinstance(item, expected):
                raise TypeError(f"{type(self).__name__} writes {expected.__name__} items, got {type(item).__name__}")
            record = self.to_record(item)
            try:
                validate_record(record, self.format)
            except ValueError as exc:
                raise type(exc)(f"item {index} (turn {item.turn_id}): {exc}") from None
            records.append(record)
        return records

    def write(self, items: Sequence[Any], path: str | Path) -> int:
        """Write the items as JSONL (atomically); returns the number of records."""
        records = self.records(items)
        atomic_write_jsonl(path, records)
        return len(records)


class OpenAIDPOWriter(Writer):
    """OpenAI preference fine-tuning: input messages, one preferred and one non-preferred reply."""

    format = "openai-dpo"

    def to_record(self, item: PreferencePair) -> dict[str, Any]:
        return {
            "input": {"messages": _messages(item.prompt)},
            "preferred_output": _assistant(item.chosen),
            "non_preferred_output": _assistant(item.rejected),
        }


class OpenAISFTWriter(Writer):
    """OpenAI supervised fine-tuning: the prompt messages and the best reply."""

    format = "openai-sft"
    kind = "supervised"

    def to_record(self, item: SupervisedExample) -> dict[str, Any]:
        return {"messages": [*_messages(item.prompt), *_assistant(item.response)]}


class TRLWriter(Writer):
    """TRL standard preference format: prompt, chosen and rejected as strings."""

    format = "trl"

    def to_record(self, item: PreferencePair) -> dict[str, Any]:
        return {"prompt": render_prompt_text(item.prompt), "chosen": item.chosen, "rejected": item.rejected}


class TRLChatWriter(Writer):
    """TRL conversational preference format: prompt messages, chosen and rejected replies."""

    format = "trl-chat"

    def to_record(self, item: PreferencePair) -> dict[str, Any]:
        return {"prompt": _messages(item.prompt), "chosen": _assistant(item.chosen),
                "rejected": _assistant(item.rejected)}


class NeMoWriter(Writer):
    """NeMo Customizer DPO format: prompt, chosen_response, rejected_response.

    Args:
        prompt_as_text: write the prompt as one string (`render_prompt_text`) instead of
            the message list.
    """

    format = "nemo"

    def __init__(self, *, prompt_as_text: bool = False) -> None:
        self.prompt_as_text = prompt_as_text

    def to_record(self, item: PreferencePair) -> dict[str, Any]:
        prompt: Any = render_prompt_text(item.prompt) if self.prompt_as_text else _messages(item.prompt)
        return {"prompt": prompt, "chosen_response": item.chosen, "rejected_response": item.rejected}


_WRITERS: dict[str, type[Writer]] = {
    w.format: w for w in (OpenAIDPOWriter, OpenAISFTWriter, TRLWriter, TRLChatWriter, NeMoWriter)
}
assert set(_WRITERS) == set(FORMATS)


def get_writer(fmt: str) -> Writer:
    """The writer of a format name (see `opto.preference.schemas.FORMATS`)."""
    if fmt not in _WRITERS:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(_WRITERS)}")
    return _WRITERS[fmt]()
