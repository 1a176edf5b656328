"""`FeedbackGuide`: a guide made from production's feedback, for inputs production logged.

Where someone gave the expected answer (the example's `info`), an output is right when it
contains that answer as a whole phrase (a production answer rarely is the bare answer). Where there is only feedback, an LLM judge scores the output from
what the users said: it is shown the input, the output to judge, and the recorded output
with its rating and comments. Before the judge is used, it judges the recorded outputs
themselves, and its verdicts are compared with the recorded scores (a thumbs up or down
either side of 0.5): `agreement` holds the figures, and a judge that agrees less often
than `min_agreement` is refused with them, since its scores would steer the search
wrong.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from .._util.async_tools import run_sync
from .._util.files import json_key
from ..errors import OptoValueError
from ..llm.base import Model
from .guides import Feedback, Guide, LLMJudgeGuide, _normalize
from .logged import LoggedRollout

__all__ = ["FeedbackGuide", "JudgeAgreement"]

logger = logging.getLogger(__name__)

#: What the judge is asked; the recorded output and the users' words are its reference.
QUESTION = (
    "The reference holds earlier outputs for the same input and what their users said of them (a rating from 0 to "
    "1 and their comments). Judge the output from what the users asked for: does it give them what they wanted, "
    "and avoid what they complained about?"
)


class JudgeAgreement(BaseModel):
    """How often the judge's verdicts on the recorded outputs matched the recorded scores."""

    agreed: int
    compared: int
    min_agreement: float

    @property
    def rate(self) -> float:
        return self.agreed / self.compared if self.compared else 0.0

    def summary(self) -> str:
        return (
            f"the judge agreed with the recorded scores on {self.agreed} of {self.compared} logged outputs "
            f"({self.rate:.0%}; at least {self.min_agreement:.0%} needed)"
        )


class FeedbackGuide(Guide):
    """Scores outputs for logged inputs: against the expected answer where there is one,
    else with an LLM judge that reads the users' recorded feedback (see the module's doc).

    Args:
        judge: the judge's model.
        records: the `LoggedRollout`s whose inputs it judges (their feedback is its reference).
        min_agreement: the least share of recorded scores the judge must agree with on the
            recorded outputs before it is used.
    """

    def __init__(self, judge: Model, records: Sequence[LoggedRollout], *, min_agreement: float = 0.8) -> None:
        if not 0.0 <= min_agreement <= 1.0:
            raise OptoValueError(f"min_agreement must be a share within [0, 1], got {min_agreement!r}")
        self.records: dict[str, list[LoggedRollout]] = {}
        for record in records:  # an input asked by several users keeps what each of them said
            self.records.setdefault(json_key(record.x), []).append(record)
        self.min_agreement = min_agreement
        self.judge = LLMJudgeGuide(judge, QUESTION)
        self.agreement: JudgeAgreement | None = None
        self._calibrating: asyncio.Lock | None = None

    def check_example(self, x: Any, info: Any) -> str | None:
        if info is None and not self.records.get(json_key(x)):
            return (
                "it has no expected answer (info) and no logged feedback for its input: FeedbackGuide cannot judge it"
            )
        return None

    def get_feedback(self, x: Any, output: Any, info: Any) -> Feedback:  # pragma: no cover - async only
        raise NotImplementedError("FeedbackGuide is asynchronous: use aget_feedback")

    async def aget_feedback(self, x: Any, output: Any, info: Any) -> Feedback:
        if info is not None:
            return _contains_answer(output, info)
        said = self.records.get(json_key(x))
        if not said:
            raise OptoValueError(f"FeedbackGuide has no logged feedback for the input {x!r} and no expected answer")
        await self.calibrate()
        return await self.judge.aget_feedback(x, output, _reference(said))

    def check_agreement(self) -> JudgeAgreement:
        """`calibrate`, from synchronous code: call it before training to see the figures."""
        return run_sync(self.calibrate())

    async def calibrate(self) -> JudgeAgreement:
        """Judge the recorded outputs and compare with the recorded scores (once); refuse a
        judge that agrees less often than `min_agreement`."""
        if self._calibrating is None:
            self._calibrating = asyncio.Lock()
        async with self._calibrating:
            if self.agreement is None:
                scored = [r for rows in self.records.values() for r in rows if r.score is not None and r.info is None]
                verdicts = await asyncio.gather(
                    *(self.judge.aget_feedback(r.x, r.output, _reference([r])) for r in scored)
                )
                agreed = sum(
                    1
                    for record, verdict in zip(scored, verdicts)
                    if verdict.score is not None and (verdict.score >= 0.5) == ((record.score or 0.0) >= 0.5)
                )
                self.agreement = JudgeAgreement(agreed=agreed, compared=len(scored), min_agreement=self.min_agreement)
                logger.info("FeedbackGuide: %s", self.agreement.summary())
        if self.agreement.compared and self.agreement.rate < self.min_agreement:
            raise OptoValueError(
                f"FeedbackGuide refuses its judge: {self.agreement.summary()}. Give expected answers (info), a "
                "stronger judge model, or a lower min_agreement"
            )
        return self.agreement


def _contains_answer(output: Any, info: Any) -> Feedback:
    """1 when the output holds an expected answer (any of a list) as a whole phrase, case
    and spacing aside; else 0, saying what was expected."""
    expected = [str(a) for a in info] if isinstance(info, (list, tuple, set, frozenset)) else [str(info)]
    said = _normalize(str(output))
    for answer in expected:
        wanted = _normalize(answer)
        if wanted and re.search(rf"(?<![\w-]){re.escape(wanted)}(?![\w-])", said):
            return Feedback(score=1.0, feedback=f"The output gives the expected answer {answer!r}.")
    return Feedback(score=0.0, feedback=f"The expected answer was {expected[0]!r}; the output does not give it.")


def _reference(records: list[LoggedRollout]) -> list[dict[str, Any]]:
    """What the users said of earlier outputs for this input, one entry a user."""
    return [{"earlier output": r.output, "users' rating": r.score, "users' comments": r.feedback} for r in records]
