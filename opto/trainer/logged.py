"""The first step of a run given logged rollouts: production's outputs judged, not re-run.

`ReplayAgent` answers each logged input with the output production recorded, so the
step's rollouts cost no agent call; `LoggedGuide` judges that output with the run's guide
and adds the recorded feedback to the guide's (where the guide cannot judge a record, a
logged score stands in). Proposals then come from production's evidence, and candidates
are screened on the logged inputs the guide judged (`judged_rollouts`), as a step's on
the batch it proposed from, then validated as in any step.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence
from typing import Any

from .._util.files import json_key
from ..core.agent import Agent
from ..core.guides import Feedback, Guide
from ..core.logged import LoggedRollout
from ..core.parameters import Parameter
from ..core.rollout import Rollout

__all__ = ["LoggedGuide", "ReplayAgent", "judged_rollouts"]


def _by_input(records: Sequence[LoggedRollout]) -> dict[str, deque[LoggedRollout]]:
    found: dict[str, deque[LoggedRollout]] = defaultdict(deque)
    for record in records:
        found[json_key(record.x)].append(record)
    return found


class ReplayAgent(Agent):
    """The agent's parameters, answering each logged input with its recorded output (in
    order, for an input logged more than once)."""

    def __init__(self, agent: Agent, records: Sequence[LoggedRollout]) -> None:
        self._agent = agent
        self._outputs = _by_input(records)

    def parameters(self, trainable_only: bool = False) -> list[Parameter]:
        return self._agent.parameters(trainable_only=trainable_only)

    async def forward(self, x: Any) -> Any:
        return self._outputs[json_key(x)].popleft().output


class LoggedGuide(Guide):
    """The run's guide on a recorded output, with the recorded feedback beside its own."""

    def __init__(self, guide: Guide, records: Sequence[LoggedRollout]) -> None:
        self.guide = guide
        self._records = _by_input(records)
        # (input, expected answer) whose score is the recorded one: the guide could not judge them
        self.unjudged: set[tuple[str, str]] = set()

    async def aget_feedback(self, x: Any, output: Any, info: Any) -> Feedback:
        record = self._records[json_key(x)].popleft()
        try:
            judged = await self.guide.aget_feedback(x, output, info)
        except Exception:  # no expectation to judge against: the recorded judgment stands in
            if record.score is None:
                raise
            self.unjudged.add((json_key(x), json_key(info)))
            judged = Feedback(score=record.score, feedback="")
        said = [judged.feedback] if judged.feedback else []
        if record.score is not None:
            said.append(f"Recorded in production: score {record.score:g}.")
        if record.feedback.strip():
            said.append(f"Recorded feedback: {record.feedback.strip()}")
        return Feedback(score=judged.score, feedback="\n".join(said))

    def get_feedback(self, x: Any, output: Any, info: Any) -> Feedback:  # pragma: no cover - async only
        raise NotImplementedError("LoggedGuide is asynchronous: use aget_feedback")


def judged_rollouts(rollouts: Sequence[Rollout], guide: LoggedGuide) -> list[Rollout]:
    """The logged rollouts the run's guide judged itself, one per input and expected
    answer. A candidate run on the same inputs is judged the same way, so they screen it
    as a batch does, and the current values' side costs no call."""
    found: dict[tuple[str, str], Rollout] = {}
    for rollout in rollouts:
        key = (json_key(rollout.x), json_key(rollout.info))
        if not rollout.failed and key not in guide.unjudged:
            found.setdefault(key, rollout)
    return list(found.values())
