"""The record schemas of the export formats, as pydantic models, and file validation.

Every writer validates each record against its model before writing, and the fine-tuning
adapters validate a file with `validate_jsonl` before uploading it, so a malformed file is
caught here, with its line number, not by a remote job an hour later.

Formats:

- ``openai-dpo``: ``{"input": {"messages": [...]}, "preferred_output": [assistant],
  "non_preferred_output": [assistant]}`` (OpenAI preference fine-tuning).
- ``openai-sft``: ``{"messages": [..., assistant]}`` (OpenAI supervised fine-tuning).
- ``trl``: ``{"prompt": str, "chosen": str, "rejected": str}`` (TRL standard preference;
  the prompt is rendered with the target model's chat template).
- ``trl-chat``: ``{"prompt": [messages], "chosen": [assistant], "rejected": [assistant]}``,
  plus ``tools`` (TRL conversational preference with an explicit prompt).
- ``nemo``: ``{"prompt": str | [messages], "chosen_response": str, "rejected_response": str}``
  (NVIDIA NeMo Customizer DPO).
- ``art``: ``{"trajectories": [{"messages_and_choices": [...], "tools", "additional_histories",
  "reward", "metrics", "metadata", "logs"}], "exceptions": []}``, one OpenPipe ART
  ``TrajectoryGroup`` per line (RL: GRPO on groups); every history keeps the
  episode-order rules of `opto.preference.trajectories.episode_problem`.

Roles differ by format: "developer" is OpenAI's alone; OpenAI needs a "tool" message to
name the `tool_call_id` it answers; NeMo's DPO prompts hold system, user and assistant
messages only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import MissingFileError, OptoError, OptoValueError
from .trajectories import episode_problem

__all__ = [
    "FORMATS",
    "ARTGroupRecord",
    "ARTTrajectoryRecord",
    "ChatMessage",
    "DatasetFormatError",
    "NeMoMessage",
    "NeMoPreferenceRecord",
    "OpenAIMessage",
    "OpenAIDPORecord",
    "OpenAISFTRecord",
    "TRLChatPreferenceRecord",
    "TRLMessage",
    "TRLPreferenceRecord",
    "validate_jsonl",
    "validate_record",
]


class DatasetFormatError(OptoError, ValueError):
    """A record or a file does not follow its format's schema."""


class ChatMessage(BaseModel):
    """A chat message. Extra keys (name, weight, ...) are kept.

    An assistant message may carry `tool_calls` (and then no content); a "tool" message
    answers one of them. Each format's subclass says which roles it admits.
    """

    model_config = ConfigDict(extra="allow")

    ROLES: ClassVar[tuple[str, ...]] = ("system", "developer", "user", "assistant", "tool")
    TOOL_CALL_ID_REQUIRED: ClassVar[bool] = False
    FORMAT: ClassVar[str] = "this format"

    role: str
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _fits_the_format(self) -> ChatMessage:
        if self.role not in self.ROLES:
            raise OptoValueError(
                f"role {self.role!r} is not accepted by {self.FORMAT}; use one of {', '.join(self.ROLES)}"
            )
        if self.tool_calls and self.role != "assistant":
            raise OptoValueError(f"only an assistant message may carry tool_calls, not a {self.role!r} one")
        if self.content is None and not self.tool_calls:
            raise OptoValueError("a message needs content (only an assistant message with tool_calls may have none)")
        if self.role == "tool" and self.TOOL_CALL_ID_REQUIRED and not self.tool_call_id:
            raise OptoValueError(
                f"{self.FORMAT} refuses a tool message without the tool_call_id of the call it answers"
            )
        return self


class OpenAIMessage(ChatMessage):
    """A message of OpenAI's fine-tuning formats."""

    TOOL_CALL_ID_REQUIRED = True
    FORMAT = "OpenAI"


class TRLMessage(ChatMessage):
    """A message of TRL's conversational format (roles of Hugging Face chat templates)."""

    ROLES = ("system", "user", "assistant", "tool")
    FORMAT = "TRL"


class NeMoMessage(ChatMessage):
    """A message of a NeMo Customizer DPO prompt."""

    ROLES = ("system", "user", "assistant")
    FORMAT = "NeMo Customizer"


class AssistantMessage(ChatMessage):
    """An assistant reply; its content must not be empty."""

    role: Literal["assistant"]
    content: str

    @field_validator("content")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        if not value.strip():
            raise OptoValueError("an assistant reply must not be empty")
        return value


def _check_prompt(messages: list[ChatMessage]) -> list[ChatMessage]:
    if not messages:
        raise OptoValueError("the prompt needs at least one message")
    if messages[-1].role == "assistant":
        raise OptoValueError("the prompt must end with a user (or system) message, not an assistant reply")
    if not any((m.content or "").strip() for m in messages):
        raise OptoValueError("every prompt message is empty")
    return messages


def _differ(chosen: str, rejected: str) -> None:
    if chosen == rejected:
        raise OptoValueError("the preferred and non-preferred responses are identical")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OpenAIDPOInput(_Strict):
    messages: list[OpenAIMessage]
    tools: list[dict[str, Any]] | None = None
    parallel_tool_calls: bool | None = None

    _prompt = field_validator("messages")(_check_prompt)


class OpenAIDPORecord(_Strict):
    """One line of an OpenAI preference (DPO) fine-tuning file."""

    input: OpenAIDPOInput
    preferred_output: list[AssistantMessage] = Field(min_length=1, max_length=1)
    non_preferred_output: list[AssistantMessage] = Field(min_length=1, max_length=1)

    @model_validator(mode="after")
    def _distinct(self) -> OpenAIDPORecord:
        _differ(self.preferred_output[0].content, self.non_preferred_output[0].content)
        return self


class OpenAISFTRecord(_Strict):
    """One line of an OpenAI supervised fine-tuning file."""

    messages: list[OpenAIMessage]
    tools: list[dict[str, Any]] | None = None
    parallel_tool_calls: bool | None = None

    @field_validator("messages")
    @classmethod
    def _ends_with_reply(cls, messages: list[OpenAIMessage]) -> list[OpenAIMessage]:
        if len(messages) < 2:
            raise OptoValueError("an example needs at least a prompt message and an assistant reply")
        if messages[-1].role != "assistant" or not (messages[-1].content or "").strip():
            raise OptoValueError("an example must end with a non-empty assistant reply")
        return messages


class TRLPreferenceRecord(_Strict):
    """TRL's standard preference format (explicit prompt)."""

    prompt: str = Field(min_length=1)
    chosen: str = Field(min_length=1)
    rejected: str = Field(min_length=1)

    @model_validator(mode="after")
    def _distinct(self) -> TRLPreferenceRecord:
        _differ(self.chosen, self.rejected)
        return self


class TRLChatPreferenceRecord(_Strict):
    """TRL's conversational preference format (explicit prompt)."""

    prompt: list[TRLMessage]
    chosen: list[AssistantMessage] = Field(min_length=1, max_length=1)
    rejected: list[AssistantMessage] = Field(min_length=1, max_length=1)
    tools: list[dict[str, Any]] | None = None

    _prompt = field_validator("prompt")(_check_prompt)

    @model_validator(mode="after")
    def _distinct(self) -> TRLChatPreferenceRecord:
        _differ(self.chosen[0].content, self.rejected[0].content)
        return self


class NeMoPreferenceRecord(_Strict):
    """NeMo Customizer's DPO format."""

    prompt: str | list[NeMoMessage]
    chosen_response: str = Field(min_length=1)
    rejected_response: str = Field(min_length=1)

    @field_validator("prompt")
    @classmethod
    def _prompt_ok(cls, value: str | list[NeMoMessage]) -> str | list[NeMoMessage]:
        if isinstance(value, str):
            if not value.strip():
                raise OptoValueError("the prompt must not be empty")
            return value
        return _check_prompt(value)  # type: ignore[arg-type,return-value]  # a NeMo message is a chat message

    @model_validator(mode="after")
    def _distinct(self) -> NeMoPreferenceRecord:
        _differ(self.chosen_response, self.rejected_response)
        return self


class ARTTrajectoryRecord(BaseModel):
    """One ART trajectory: its histories keep the episode order, its reward is a finite number."""

    model_config = ConfigDict(extra="allow")

    messages_and_choices: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    additional_histories: list[dict[str, Any]] = Field(default_factory=list)
    reward: float = Field(allow_inf_nan=False)
    metrics: dict[str, float | int | bool] = Field(default_factory=dict)
    metadata: dict[str, float | int | str | bool | None] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _in_episode_order(self) -> ARTTrajectoryRecord:
        histories = [
            self.messages_and_choices,
            *(h.get("messages_and_choices") or [] for h in self.additional_histories),
        ]
        for index, history in enumerate(histories):
            problem = episode_problem(history)
            if problem is not None:
                where = "messages_and_choices" if index == 0 else f"additional_histories.{index - 1}"
                raise OptoValueError(f"{where}: {problem}")
        return self


class ARTGroupRecord(BaseModel):
    """One ART trajectory group (one example's trajectories)."""

    model_config = ConfigDict(extra="allow")

    trajectories: list[ARTTrajectoryRecord] = Field(min_length=1)
    exceptions: list[dict[str, Any]] = Field(default_factory=list)


FORMATS: dict[str, type[BaseModel]] = {
    "openai-dpo": OpenAIDPORecord,
    "openai-sft": OpenAISFTRecord,
    "trl": TRLPreferenceRecord,
    "trl-chat": TRLChatPreferenceRecord,
    "nemo": NeMoPreferenceRecord,
    "art": ARTGroupRecord,
}


def _schema(fmt: str) -> type[BaseModel]:
    if fmt not in FORMATS:
        raise OptoValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    return FORMATS[fmt]


def _explain(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "record"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


def validate_record(record: Any, fmt: str) -> None:
    """Raise `DatasetFormatError` saying what is wrong when `record` does not fit `fmt`."""
    try:
        _schema(fmt).model_validate(record)
    except ValidationError as exc:
        raise DatasetFormatError(f"not a valid {fmt} record: {_explain(exc)}") from None


def validate_jsonl(path: str | Path, fmt: str, *, min_examples: int = 1) -> int:
    """Check every line of a JSONL file against `fmt`; returns the number of records.

    Raises `DatasetFormatError` naming the first bad line, or when the file holds fewer
    than `min_examples` records; `FileNotFoundError` when it is missing.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"dataset file not found: {path}")
    count = 0
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetFormatError(f"{path}:{number} is not valid JSON: {exc.msg}") from None
            try:
                validate_record(record, fmt)
            except DatasetFormatError as exc:
                raise DatasetFormatError(f"{path}:{number}: {exc}") from None
            count += 1
    if count < min_examples:
        raise DatasetFormatError(
            f"{path} holds {count} {fmt} example{'s' if count != 1 else ''}; at least {min_examples} are needed "
            "(train longer, export more sources with --source all, or lower --min-score-diff)"
        )
    return count
