"""Reading turns from a run directory: one prompt, several scored responses.

A *turn* is one LLM call context (the same prompt messages) that produced two or more
responses, each with a score. The ledger of a training run holds three kinds:

**optimizer** — the optimizer's prompt for one instance, answered `num_proposals` times.
Each proposal is scored by the ``proposal_score`` records the trainer writes with
``AggregatedUpdate(score_proposals="instance" | "minibatch")``; without them optimizer
turns have no scores and give no pairs. Key: (step, instance, prompt messages).

**aggregator** — the aggregator's final prompt of a step, answered `num_candidates` times.
Each candidate is scored by its validation (the ``decision`` record's
``candidate_score``). A candidate that asked for no change gets the step's current score
(the ``current_score`` of the step's decisions). Intermediate group merges are never
validated, so they are left out. Key: (step, prompt messages); the example id is
``step-<n>``, as the prompt covers the whole batch.

**agent** — the agent's own model calls. Within a step, one instance is run under
different parameter values: the current values (phase ``train``), each candidate
(``validation``) and each scored proposal (``proposal_validation``); each rollout's
score is the guide's. Because the optimized parameter usually *is* (part of) the agent's
prompt, the full message lists of those runs differ, and responses to different prompts
cannot form a preference pair. opto therefore pairs agent calls on their **visible
input**: the call's messages without its system messages.

- Calls of the same step and instance whose visible inputs are identical form one turn;
  the response is the call's reply, the score is its rollout's score (every call of a
  multi-call agent gets its rollout's score).
- When all the turn's calls also share the same system messages (the optimized parameter
  is not in the prompt, e.g. a numeric knob or a post-processing rule), the prompt is the
  full message list. Otherwise it is the visible input alone: chosen and rejected are
  then the replies the better- and worse-scoring parameter values produced for that same
  input, so the agent's model learns to answer, without the optimized system prompt, the
  way the optimized prompt made it answer.
- A call whose messages are only system messages, and calls whose visible inputs differ
  (the parameter sits in a user message, or an earlier call's reply differed), pair with
  nothing. Failed rollouts (agent or guide raised) and unscored rollouts are left out:
  they say nothing reliable about the response.
"""

from __future__ import annotations

import hashlib
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from .._util.files import json_key
from ..errors import MissingFileError, OptoValueError
from ..llm.types import content_text
from ..run.ledger import RunDir

__all__ = ["SOURCES", "Source", "Turn", "TurnCandidate", "TurnReading", "read_turns"]

logger = logging.getLogger(__name__)

Source = Literal["optimizer", "aggregator", "agent"]
SOURCES: tuple[str, ...] = ("optimizer", "aggregator", "agent")


class TurnCandidate(BaseModel):
    """One scored response of a turn. A `truncated` one was cut at max_tokens: it may be
    rejected, never chosen."""

    response: str
    score: float
    ref: str = Field(description="where it comes from: a proposal_id, candidate_id or rollout reference")
    truncated: bool = False


class Turn(BaseModel):
    """One prompt (message list) and the scored responses it produced; `tools` holds the
    tool definitions the model was offered (agent calls with tools)."""

    turn_id: str
    source: Source
    step: int
    example_id: str
    prompt: list[dict[str, Any]]
    candidates: list[TurnCandidate] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None


class TurnReading(BaseModel):
    """The turns read from a run, and what could not be used (by reason)."""

    turns: list[Turn] = Field(default_factory=list)
    unscored: dict[str, int] = Field(default_factory=dict)

    def note(self, reason: str, count: int = 1) -> None:
        self.unscored[reason] = self.unscored.get(reason, 0) + count


def read_turns(run: RunDir | str | Path | Sequence[dict[str, Any]], source: str = "all") -> TurnReading:
    """Read the turns of `source` ("optimizer", "aggregator", "agent" or "all") from a run.

    `run` is a `RunDir`, the path of a run directory, or ledger records already read.
    Turns come in ledger order; each turn's candidates in the order they were recorded.
    """
    sources = _sources(source)
    if isinstance(run, (str, Path)):
        path = Path(run)
        if not (path / "ledger.jsonl").is_file():
            raise MissingFileError(
                f"{path} has no ledger.jsonl: pass the run_dir of a training run (train(..., run_dir=...))"
            )
        run = RunDir(path)
    records = run.ledger() if isinstance(run, RunDir) else list(run)
    reading = TurnReading()
    if "optimizer" in sources:
        reading.turns.extend(_optimizer_turns(records, reading))
    if "aggregator" in sources:
        reading.turns.extend(_aggregator_turns(records, reading))
    if "agent" in sources:
        reading.turns.extend(_agent_turns(records, reading))
    logger.info(
        "read %d turns (%s) from %d ledger records; unused: %s",
        len(reading.turns),
        source,
        len(records),
        reading.unscored or "none",
    )
    return reading


def _sources(source: str) -> tuple[str, ...]:
    if source == "all":
        return SOURCES
    if source not in SOURCES:
        raise OptoValueError(f"source must be one of {', '.join(SOURCES)} or 'all', got {source!r}")
    return (source,)


# ------------------------------------------------------------------------------ helpers


def _messages(raw: Any) -> list[dict[str, Any]]:
    """{role, content: str} messages, with an assistant's "tool_calls" and a tool message's
    "tool_call_id" kept; anything else in a message is dropped."""
    if not isinstance(raw, list):
        return []
    messages = []
    for m in raw:
        if not isinstance(m, dict):
            continue
        message: dict[str, Any] = {"role": str(m.get("role")), "content": content_text(m.get("content"))}
        for key in ("tool_calls", "tool_call_id"):
            if m.get(key):
                message[key] = m[key]
        messages.append(message)
    return messages


def _key(*parts: Any) -> str:
    return json_key(parts)


def _turn_id(source: str, step: int, prompt: list[dict[str, Any]], example_id: str) -> str:
    digest = hashlib.sha256(_key(source, step, example_id, prompt).encode()).hexdigest()[:16]
    return f"{source}-{step}-{digest}"


def _score(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _of_type(records: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r.get("type") == kind]


# ------------------------------------------------------------------------------ sources


def _optimizer_turns(records: list[dict[str, Any]], reading: TurnReading) -> list[Turn]:
    scores = {r.get("proposal_id"): _score(r.get("score")) for r in _of_type(records, "proposal_score")}
    proposals = _of_type(records, "proposal")
    if proposals and not scores:
        logger.warning(
            "the run has proposals but no proposal_score records: optimizer turns need "
            "AggregatedUpdate(..., score_proposals='instance') (and num_proposals > 1)"
        )
    return _scored_turns(
        "optimizer",
        proposals,
        reading,
        example_of=lambda r: str(r.get("instance_id", "")),
        score_of=lambda r: scores.get(r.get("proposal_id")),
        ref_of=lambda r: str(r.get("proposal_id")),
        unscored="optimizer: proposal without a score",
    )


def _aggregator_turns(records: list[dict[str, Any]], reading: TurnReading) -> list[Turn]:
    decisions = _of_type(records, "decision")
    scores = {r.get("candidate_id"): _score(r.get("candidate_score")) for r in decisions if r.get("candidate_id")}
    current: dict[int, float | None] = {}
    for record in decisions:
        if record.get("candidate_id") and _score(record.get("current_score")) is not None:
            current.setdefault(int(record.get("step", 0)), _score(record.get("current_score")))

    def score_of(record: dict[str, Any]) -> float | None:
        score = scores.get(record.get("candidate_id"))
        if score is None and not record.get("update") and not record.get("error"):
            score = current.get(int(record.get("step", 0)))  # "no change": the current values' score
        return score

    # Intermediate group merges are never validated, so only final candidates count.
    finals = [r for r in _of_type(records, "candidate") if r.get("final", True)]
    return _scored_turns(
        "aggregator",
        finals,
        reading,
        example_of=lambda r: f"step-{int(r.get('step', 0))}",  # the prompt covers the whole batch
        score_of=score_of,
        ref_of=lambda r: str(r.get("candidate_id")),
        unscored="aggregator: candidate without a validation score",
    )


def _scored_turns(
    source: Source,
    records: list[dict[str, Any]],
    reading: TurnReading,
    *,
    example_of: Callable[[dict[str, Any]], str],
    score_of: Callable[[dict[str, Any]], float | None],
    ref_of: Callable[[dict[str, Any]], str],
    unscored: str,
) -> list[Turn]:
    """Group LLM replies by (step, example, prompt messages); each scored reply is a candidate."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        prompt = _messages(record.get("prompt_messages"))
        if not prompt:  # made by rule (DemoProposer, the demo merge): no model reply to learn from
            reading.note(f"{source}: made by rule, not by a model")
            continue
        groups[_key(record.get("step", 0), example_of(record), prompt)].append(record)
    turns = []
    for members in groups.values():
        first = members[0]
        step, example_id = int(first.get("step", 0)), example_of(first)
        prompt = _messages(first.get("prompt_messages"))
        candidates = []
        for record in members:
            score = score_of(record)
            if score is None:
                reading.note(unscored)
                continue
            candidates.append(
                TurnCandidate(
                    response=str(record.get("raw_response", "")),
                    score=score,
                    ref=ref_of(record),
                    truncated=bool(record.get("truncated")),
                )
            )
        turns.append(
            Turn(
                turn_id=_turn_id(source, step, prompt, example_id),
                source=source,
                step=step,
                example_id=example_id,
                prompt=prompt,
                candidates=candidates,
            )
        )
    return turns


def _agent_turns(records: list[dict[str, Any]], reading: TurnReading) -> list[Turn]:
    # (step, instance, visible input) -> [(system messages, full messages, candidate)]
    groups: dict[str, list[tuple[list[dict[str, Any]], list[dict[str, Any]], TurnCandidate]]] = defaultdict(list)
    meta: dict[str, tuple[int, str, list[dict[str, Any]], Any]] = {}
    for index, record in enumerate(_of_type(records, "rollout")):
        score = _score(record.get("score"))
        if record.get("error") or score is None:
            reading.note("agent: failed or unscored rollout")
            continue
        step, example_id = int(record.get("step", 0)), str(record.get("instance_id", ""))
        ref = _rollout_ref(record, index)
        for position, call in enumerate(record.get("trace") or []):
            if "messages" not in call:  # a tool's result, not a model call
                continue
            messages = _messages(call.get("messages"))
            visible = [m for m in messages if m["role"] != "system"]
            if not visible:
                reading.note("agent: call with only system messages")
                continue
            system = [m for m in messages if m["role"] == "system"]
            tools = call.get("tools") or None
            key = _key(step, example_id, visible, tools)
            meta.setdefault(key, (step, example_id, visible, tools))
            groups[key].append(
                (
                    system,
                    messages,
                    TurnCandidate(
                        response=content_text(call.get("response")),
                        score=score,
                        ref=f"{ref}#call{position}",
                        truncated=bool(call.get("truncated")),
                    ),
                )
            )
    turns = []
    for key, members in groups.items():
        step, example_id, visible, tools = meta[key]
        same_system = all(system == members[0][0] for system, _, _ in members)
        prompt = members[0][1] if same_system else visible
        turns.append(
            Turn(
                turn_id=_turn_id("agent", step, prompt, example_id),
                source="agent",
                step=step,
                example_id=example_id,
                prompt=prompt,
                candidates=[c for _, _, c in members],
                tools=tools,
            )
        )
    return turns


def _rollout_ref(record: dict[str, Any], index: int) -> str:
    phase = record.get("phase", "?")
    owner = record.get("candidate_id") or record.get("proposal_id") or "current"
    return f"rollout:{record.get('step', 0)}:{record.get('instance_id', '')}:{phase}:{owner}:{index}"
