"""What production already did: `LoggedRollout`, one logged run of the agent with its feedback.

A logged rollout is the input the agent got in production, the output it gave, and
whatever was said of that output: a score (a thumbs up is 1, down 0; a rating scaled to
[0, 1]), feedback text (a comment, a rationale), and the expected answer when someone
gave one (`info`, what a guide judges against). The recorded output is evidence of how the
current values did, never a target: a guide judges it, and the logged feedback is shown to
the optimizer beside the guide's own. `train(logged=[...])` makes them the first step's
evidence, so its proposals come from production without running the agent again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..errors import OptoTypeError, OptoValueError
from .data import Example

__all__ = ["LoggedRollout", "logged_examples", "split_newest"]


class LoggedRollout(BaseModel):
    """One logged run of the agent and what was said of it.

    Attributes:
        x: the input, as the agent takes it.
        output: what the agent answered (the values in production at the time).
        score: the recorded judgment in [0, 1] (thumbs up 1, down 0), or None.
        feedback: the recorded comments and rationales, as text.
        info: the expected answer or other expectations, when someone gave them (what the
            guide judges against); None when there are none.
        id: names the record (its trace id); a default is given by position.
        time: when it happened (seconds since the epoch), for holding out the newest.
        source: where it was read from (a trace store, a file).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    x: Any
    output: Any = None
    score: float | None = None
    feedback: str = ""
    info: Any = None
    id: str | None = None
    time: float | None = None
    source: str | None = Field(default=None, repr=False)

    @field_validator("score")
    @classmethod
    def _in_range(cls, score: float | None) -> float | None:
        if score is not None and not 0.0 <= score <= 1.0:
            raise OptoValueError(f"score: {score} is outside [0, 1]: scale a rating to it (thumbs up 1, down 0)")
        return score

    @property
    def has_signal(self) -> bool:
        """Whether anything was said of the output (a score, feedback or an expectation)."""
        return self.score is not None or bool(self.feedback.strip()) or self.info is not None


def logged_examples(records: Sequence[LoggedRollout]) -> list[Example]:
    """The records as examples (x, info and a unique id each), checked: a record that is
    not a `LoggedRollout` (or a dict of its fields) or a repeated id is refused by position."""
    if isinstance(records, (str, bytes)) or not isinstance(records, Sequence):
        raise OptoTypeError(f"logged must be a list of LoggedRollout, got {type(records).__name__}")
    found: list[Example] = []
    seen: set[str] = set()
    for index, record in enumerate(records):
        if isinstance(record, dict):
            record = LoggedRollout(**record)
        if not isinstance(record, LoggedRollout):
            raise OptoTypeError(f"logged[{index}] must be a LoggedRollout, got {type(record).__name__}")
        key = record.id or f"logged-{index}"
        if key in seen:
            raise OptoValueError(f"logged[{index}]: the id {key!r} is repeated; give each record its own id")
        seen.add(key)
        found.append(Example(record.x, record.info, id=key))
    return found


def split_newest(
    records: Sequence[LoggedRollout], newest: float = 0.25, *, at: float | None = None
) -> tuple[list[LoggedRollout], list[LoggedRollout]]:
    """(older, newest) records by time: the newest `newest` share (a fraction in (0, 1))
    or, with `at`, every record from that time on (a window: optimize on what came
    before, check on what came after). Records with no time count as the oldest."""
    ordered = sorted(records, key=lambda r: r.time if r.time is not None else float("-inf"))
    if at is not None:
        return [r for r in ordered if r.time is None or r.time < at], [r for r in ordered if r.time is not None
                                                                       and r.time >= at]  # fmt: skip
    if not 0.0 < newest < 1.0:
        raise OptoValueError(f"newest must be a share within (0, 1), got {newest!r}")
    cut = len(ordered) - max(1, round(newest * len(ordered))) if ordered else 0
    return ordered[:cut], ordered[cut:]
