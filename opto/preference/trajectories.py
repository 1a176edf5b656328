"""From a run's rollouts to RL data: trajectory groups with rewards, in OpenPipe ART's shape.

A *trajectory group* holds every rollout of one example in one step of a run: the
training rollout under the current values and each candidate's validation rollout (or,
for `opto.collect`, the G samples of the example). Each rollout becomes a trajectory:

- its **last model call** is the main history: the call's messages (system, user,
  assistant with tool calls, tool results) followed by the reply as an assistant
  *choice* (`{"finish_reason", "index", "message", "logprobs"}`, as in an OpenAI chat
  completion); earlier calls become `additional_histories`, as ART keeps them;
- its **reward** is the guide's score; `metrics` and `metadata` say where it comes from
  (step, phase, candidate, the values' digest, the example).

GRPO learns from the differences within a group (advantage = (reward - group mean) /
(group std + 1e-6)), so groups of one trajectory and groups whose rewards do not vary
teach nothing: they are dropped and counted, and so are rollouts that failed, were not
scored, made no model call, or break the episode-order rules (`episode_problem`).
"""

from __future__ import annotations

import logging
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ..errors import MissingFileError, OptoValueError
from ..llm.types import ToolCall, content_text, tool_calls_of
from ..run.ledger import RunDir

__all__ = ["GroupReading", "GroupStats", "Trajectory", "TrajectoryGroup", "episode_problem", "read_groups"]

logger = logging.getLogger(__name__)

_ROLES = ("system", "user", "assistant", "tool")


class Trajectory(BaseModel):
    """One rollout as ART's `Trajectory` (its JSON fields, `model_dump(mode="json")`)."""

    messages_and_choices: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    additional_histories: list[dict[str, Any]] = Field(default_factory=list)
    reward: float
    metrics: dict[str, float | int | bool] = Field(default_factory=dict)
    metadata: dict[str, float | int | str | bool | None] = Field(default_factory=dict)
    logs: list[str] = Field(default_factory=list)

    @property
    def has_logprobs(self) -> bool:
        """Whether every assistant choice carries the sampling model's logprobs (on-policy data)."""
        choices = [m for m in self._all_messages() if "finish_reason" in m]
        return bool(choices) and all(c.get("logprobs") for c in choices)

    def _all_messages(self) -> list[dict[str, Any]]:
        return [*self.messages_and_choices, *(m for h in self.additional_histories for m in h["messages_and_choices"])]


class TrajectoryGroup(BaseModel):
    """The trajectories of one example in one step: ART's `TrajectoryGroup`."""

    trajectories: list[Trajectory]
    exceptions: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]

    @property
    def example_id(self) -> str:
        """The example the group's rollouts ran on (train/validation splits keep it whole)."""
        return str(self.trajectories[0].metadata.get("example_id", "")) if self.trajectories else ""


class GroupStats(BaseModel):
    """What `read_groups` kept and what it dropped, by reason."""

    groups: int = 0
    trajectories: int = 0
    off_policy_trajectories: int = 0
    dropped_groups: dict[str, int] = Field(default_factory=dict)
    dropped_rollouts: dict[str, int] = Field(default_factory=dict)

    def drop_group(self, reason: str) -> None:
        self.dropped_groups[reason] = self.dropped_groups.get(reason, 0) + 1

    def drop_rollout(self, reason: str) -> None:
        self.dropped_rollouts[reason] = self.dropped_rollouts.get(reason, 0) + 1

    def summary(self) -> str:
        parts = [f"{self.groups} groups", f"{self.trajectories} trajectories"]
        if self.trajectories:
            parts.append(f"{self.off_policy_trajectories} without logprobs")
        parts += [f"{count} groups dropped ({reason})" for reason, count in self.dropped_groups.items()]
        parts += [f"{count} rollouts left out ({reason})" for reason, count in self.dropped_rollouts.items()]
        return ", ".join(parts)


class GroupReading(BaseModel):
    """The groups read from a run and the counts of what was kept and dropped."""

    groups: list[TrajectoryGroup] = Field(default_factory=list)
    stats: GroupStats = Field(default_factory=GroupStats)


def read_groups(
    run: RunDir | str | Path | Sequence[dict[str, Any]], *, min_group_size: int = 2, keep_constant_rewards: bool = False
) -> GroupReading:
    """Trajectory groups from a run: one per example per step (see the module's docstring).

    Args:
        run: a `RunDir`, a run directory (or its ledger.jsonl), or ledger records.
        min_group_size: groups with fewer trajectories are dropped.
        keep_constant_rewards: keep groups whose rewards are all equal (GRPO learns
            nothing from them; other methods may).
    """
    if min_group_size < 1:
        raise OptoValueError(f"min_group_size must be >= 1, got {min_group_size}")
    records = _records(run)
    reading = GroupReading()
    stats = reading.stats
    members: dict[tuple[int, str], list[Trajectory]] = defaultdict(list)
    for record in records:
        if record.get("type") != "rollout":
            continue
        trajectory = _trajectory(record, stats)
        if trajectory is not None:
            members[(int(record.get("step", 0)), str(record.get("instance_id", "")))].append(trajectory)
    for trajectories in members.values():
        if len(trajectories) < min_group_size:
            stats.drop_group(f"fewer than {min_group_size} trajectories")
        elif not keep_constant_rewards and statistics.pstdev(t.reward for t in trajectories) == 0:
            stats.drop_group("every reward equal")
        else:
            reading.groups.append(TrajectoryGroup(trajectories=trajectories))
    stats.groups = len(reading.groups)
    stats.trajectories = sum(len(g.trajectories) for g in reading.groups)
    stats.off_policy_trajectories = sum(not t.has_logprobs for g in reading.groups for t in g.trajectories)
    logger.info("trajectory groups: %s", stats.summary())
    return reading


def episode_problem(messages: Sequence[dict[str, Any]]) -> str | None:
    """What breaks the episode-order rules in one history, or None when it keeps them.

    The rules (NeMo Agent Toolkit's for ART, with tool turns kept): every role is system,
    user, assistant or tool; the first message is system or user; the last is assistant;
    no two consecutive messages share a role, except system and tool messages (several
    tool results answer one assistant message); a tool message follows an assistant
    message that asked for tools, or another tool message.
    """
    if not messages:
        return "no messages"
    roles = [_role(m) for m in messages]
    unknown = [r for r in roles if r not in _ROLES]
    if unknown:
        return f"role {unknown[0]!r} is not one of {', '.join(_ROLES)}"
    if roles[0] not in ("system", "user"):
        return f"the first message is {roles[0]}, not system or user"
    if roles[-1] != "assistant":
        return f"the last message is {roles[-1]}, not assistant"
    for index in range(1, len(roles)):
        role, before = roles[index], roles[index - 1]
        if role == before and role not in ("system", "tool"):
            return f"two {role} messages in a row (at {index - 1} and {index})"
        if role == "tool" and not (before == "tool" or (before == "assistant" and _tool_calls(messages[index - 1]))):
            return f"a tool message (at {index}) that answers no assistant tool call"
    return None


# ------------------------------------------------------------------------------ helpers


def _records(run: RunDir | str | Path | Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(run, RunDir):
        return run.ledger()
    if isinstance(run, (str, Path)):
        path = Path(run)
        if path.name == "ledger.jsonl" and path.is_file():
            path = path.parent
        if not (path / "ledger.jsonl").is_file():
            raise MissingFileError(f"{path} has no ledger.jsonl: pass the run_dir of a training or collect run")
        return RunDir(path).ledger()
    return list(run)


def _trajectory(record: dict[str, Any], stats: GroupStats) -> Trajectory | None:
    score = record.get("score")
    if record.get("error"):
        stats.drop_rollout("failed")
        return None
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        stats.drop_rollout("no score")
        return None
    calls = [c for c in record.get("trace") or [] if isinstance(c, dict) and "messages" in c]
    if not calls:
        stats.drop_rollout("no model call")
        return None
    histories = [_history(call) for call in calls]
    for history in histories:
        problem = episode_problem(history["messages_and_choices"])
        if problem is not None:
            stats.drop_rollout(f"episode order: {problem}")
            return None
    last = histories[-1]
    return Trajectory(
        messages_and_choices=last["messages_and_choices"],
        tools=last["tools"],
        additional_histories=histories[:-1],
        reward=float(score),
        metrics={"score": float(score), "model_calls": len(calls), "truncated": any(c.get("truncated") for c in calls)},
        metadata={
            "step": int(record.get("step", 0)),
            "phase": str(record.get("phase", "")),
            "example_id": str(record.get("instance_id", "")),
            "candidate_id": record.get("candidate_id"),
            "proposal_id": record.get("proposal_id"),
            "sample": record.get("sample"),
            "values_hash": record.get("values_hash"),
        },
    )


def _history(call: dict[str, Any]) -> dict[str, Any]:
    """One model call: its messages, then its reply as an assistant choice."""
    messages = [_message(m) for m in call.get("messages") or [] if isinstance(m, dict)]
    reply: dict[str, Any] = {"role": "assistant", "content": content_text(call.get("response"))}
    if call.get("tool_calls"):
        reply["tool_calls"] = [_wire_tool_call(c) for c in call["tool_calls"]]
    choice = {
        "finish_reason": _finish_reason(call),
        "index": 0,
        "message": reply,
        "logprobs": {"content": call["logprobs"]} if call.get("logprobs") else None,
    }
    return {"messages_and_choices": [*messages, choice], "tools": call.get("tools") or None}


def _finish_reason(call: dict[str, Any]) -> str:
    if call.get("truncated"):
        return "length"
    return "tool_calls" if call.get("tool_calls") else "stop"


def _message(raw: dict[str, Any]) -> dict[str, Any]:
    """A chat message with text content; tool calls and tool-call ids kept."""
    message: dict[str, Any] = {"role": str(raw.get("role")), "content": content_text(raw.get("content"))}
    if raw.get("tool_calls"):
        message["tool_calls"] = [_wire_tool_call(c) for c in raw["tool_calls"]]
    if raw.get("tool_call_id"):
        message["tool_call_id"] = raw["tool_call_id"]
    return message


def _wire_tool_call(call: Any) -> dict[str, Any]:
    """A tool call in OpenAI's wire shape, from the wire shape or the trace's flat {id, name, arguments}."""
    found = tool_calls_of({"tool_calls": [call]}) or [ToolCall.model_validate(call)]
    return found[0].to_message_part()


def _role(message: dict[str, Any]) -> str:
    """A message's role; an ART choice is the assistant's."""
    if "finish_reason" in message and isinstance(message.get("message"), dict):
        return str(message["message"].get("role", "assistant"))
    return str(message.get("role"))


def _tool_calls(message: dict[str, Any]) -> Any:
    inner = message.get("message") if "finish_reason" in message else message
    return (inner or {}).get("tool_calls")
