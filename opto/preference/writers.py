"""Writers: preference pairs (or best responses) -> JSONL records of one format.

Each writer turns items into records, validates every record against its format's schema
(`opto.preference.schemas`) and writes the file atomically. Pick one by name with
`get_writer("openai-dpo" | "openai-sft" | "trl" | "trl-chat" | "nemo" | "art", **options)`
("art" writes trajectory groups, not pairs):
"trl" needs `tokenizer=` (the target model's, for its chat template) and "nemo" takes
`prompt="messages" | "string"`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from .._util.files import atomic_write_jsonl
from ..errors import OptoTypeError, OptoValueError
from ..search.registry import lookup
from .pairs import PreferencePair, SupervisedExample
from .schemas import validate_record
from .trajectories import TrajectoryGroup

__all__ = [
    "ARTWriter",
    "NeMoWriter",
    "OpenAIDPOWriter",
    "OpenAISFTWriter",
    "TRLChatWriter",
    "TRLWriter",
    "Writer",
    "get_writer",
]


def _messages(prompt: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The prompt's messages with what the formats know: role, content, tool calls and ids."""
    return [
        {key: m[key] for key in ("role", "content", "tool_calls", "tool_call_id") if m.get(key) is not None}
        for m in prompt
    ]


def _with_tools(record: dict[str, Any], tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    if tools:
        record["tools"] = tools
    return record


def _assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


class Writer:
    """Base class: `to_record` builds one record; `records` and `write` validate each."""

    format: ClassVar[str]
    kind: ClassVar[Literal["pairs", "supervised", "groups"]] = "pairs"

    def to_record(self, item: Any) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def records(self, items: Sequence[Any]) -> list[dict[str, Any]]:
        """Every item as a validated record (`DatasetFormatError` names the first bad one)."""
        expected = {"supervised": SupervisedExample, "groups": TrajectoryGroup}.get(self.kind, PreferencePair)
        records: list[dict[str, Any]] = []
        for index, item in enumerate(items):
            if not isinstance(item, expected):
                raise OptoTypeError(
                    f"{type(self).__name__} writes {expected.__name__} items, got {type(item).__name__}"
                )
            record = self.to_record(item)
            try:
                validate_record(record, self.format)
            except ValueError as exc:
                raise type(exc)(f"item {index} ({_item_name(item)}): {exc}") from None
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
            "input": _with_tools({"messages": _messages(item.prompt)}, item.tools),
            "preferred_output": _assistant(item.chosen),
            "non_preferred_output": _assistant(item.rejected),
        }


class OpenAISFTWriter(Writer):
    """OpenAI supervised fine-tuning: the prompt messages and the best reply."""

    format = "openai-sft"
    kind = "supervised"

    def to_record(self, item: SupervisedExample) -> dict[str, Any]:
        return _with_tools({"messages": [*_messages(item.prompt), *_assistant(item.response)]}, item.tools)


class TRLWriter(Writer):
    """TRL standard preference format: prompt, chosen and rejected as strings.

    TRL applies no chat template to this format, so the prompt is rendered here with the
    target model's template (and its generation prompt): the model is trained on the text
    it sees when served.

    Args:
        tokenizer: the target model's tokenizer, or the path (or hub id) of its folder.
    """

    format = "trl"

    def __init__(self, *, tokenizer: Any = None) -> None:
        if tokenizer is None:
            raise OptoValueError(
                "the trl format needs the target model's chat template: pass tokenizer= (a tokenizer or its "
                "model folder; --tokenizer PATH on the command line), or export trl-chat, which TRL renders "
                "with the model's template itself"
            )
        self.tokenizer = _load_tokenizer(tokenizer)

    def to_record(self, item: PreferencePair) -> dict[str, Any]:
        prompt = self.tokenizer.apply_chat_template(
            _messages(item.prompt), tools=item.tools, tokenize=False, add_generation_prompt=True
        )
        return {"prompt": prompt, "chosen": item.chosen, "rejected": item.rejected}


class TRLChatWriter(Writer):
    """TRL conversational preference format: prompt messages, chosen and rejected replies."""

    format = "trl-chat"

    def to_record(self, item: PreferencePair) -> dict[str, Any]:
        return _with_tools(
            {
                "prompt": _messages(item.prompt),
                "chosen": _assistant(item.chosen),
                "rejected": _assistant(item.rejected),
            },
            item.tools,
        )


class NeMoWriter(Writer):
    """NeMo Customizer DPO format: prompt, chosen_response, rejected_response.

    Args:
        prompt: "messages" writes the whole conversation as a message list; "string"
            writes the last message's content, as NeMo Agent Toolkit's string mode does.
    """

    format = "nemo"

    def __init__(self, *, prompt: Literal["messages", "string"] = "messages") -> None:
        if prompt not in ("messages", "string"):
            raise OptoValueError(f"prompt must be 'messages' or 'string', got {prompt!r}")
        self.prompt = prompt

    def to_record(self, item: PreferencePair) -> dict[str, Any]:
        prompt: Any = item.prompt[-1]["content"] if self.prompt == "string" else _messages(item.prompt)
        return {"prompt": prompt, "chosen_response": item.chosen, "rejected_response": item.rejected}


class ARTWriter(Writer):
    """OpenPipe ART: one `TrajectoryGroup` per line, as `TrajectoryGroup.model_dump(mode="json")`."""

    format = "art"
    kind = "groups"

    def to_record(self, item: TrajectoryGroup) -> dict[str, Any]:
        return item.model_dump(mode="json")


def _item_name(item: Any) -> str:
    return f"turn {item.turn_id}" if hasattr(item, "turn_id") else f"group of example {item.example_id}"


def get_writer(fmt: str, **options: Any) -> Writer:
    """The writer of a format name (the registry's "preference format" kind), made with
    `options` (None values are left out): `tokenizer` for "trl", `prompt` for "nemo"."""
    writer = lookup("preference format", fmt)  # an unknown name is an error listing the names
    options = {key: value for key, value in options.items() if value is not None}
    try:
        return writer(**options)
    except TypeError:
        raise OptoValueError(f"the {fmt} format takes no option {sorted(options)}") from None


def _load_tokenizer(tokenizer: Any) -> Any:
    """A tokenizer with a chat template: as given, or loaded from a model folder or hub id."""
    if isinstance(tokenizer, (str, Path)):
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:
            raise OptoValueError("loading a tokenizer needs transformers: pip install 'opto-agents[trl]'") from exc
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        except (OSError, ValueError) as exc:
            raise OptoValueError(f"could not load a tokenizer from {tokenizer}: {exc}") from exc
    if not getattr(tokenizer, "chat_template", None):
        raise OptoValueError(
            "this tokenizer has no chat template, so the trl prompt cannot be rendered as the model "
            "sees it; export trl-chat, or give the tokenizer of a chat model"
        )
    return tokenizer
