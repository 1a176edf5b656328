"""Guides: they judge an agent's output for one example and return a `Feedback`.

A guide gives a score (higher is better, usually in [0, 1]) and text feedback the
optimizer reads. `score=None` means "could not judge" (e.g. the judge model failed):
such a result is left out of means, never counted as 0.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import re
from collections.abc import Sequence
from json.encoder import encode_basestring
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, field_validator

from ..errors import OptoTypeError, OptoValueError
from ..llm.base import Model
from ..llm.errors import BudgetExceeded, LLMError
from .prompting import PromptTemplate

if TYPE_CHECKING:
    from .data import Example

__all__ = ["ExactMatchGuide", "Feedback", "Guide", "LLMJudgeGuide", "check_examples", "parse_score"]


class Feedback(BaseModel):
    """A guide's verdict on one output.

    Args:
        score: a finite number (higher is better), or None when the output could not be
            judged; None is left out of means, never counted as 0.
        feedback: text for the optimizer: what was right or wrong and why.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    score: float | None
    feedback: str = ""

    def __init__(self, score: float | None = None, feedback: str = "", **kw: Any) -> None:
        super().__init__(score=score, feedback=feedback, **kw)

    @field_validator("score", mode="before")
    @classmethod
    def _check_score(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise OptoValueError(f"score must be a number or None, got {type(value).__name__} {value!r}")
        if not math.isfinite(value):
            raise OptoValueError(f"score must be finite, got {value!r}; use None for 'could not judge'")
        return float(value)


class Guide:
    """Base class of guides.

    Subclasses implement `get_feedback(x, output, info)`, sync or `async def`; it may
    return a `Feedback`, a `(score, feedback)` tuple or a bare number. Callers use
    `aget_feedback`, which works for both kinds and always returns a `Feedback`.
    """

    def get_feedback(self, x: Any, output: Any, info: Any) -> Any:
        """Judge `output`, the agent's answer to input `x`; `info` is the example's info."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_feedback(x, output, info)")

    def check_example(self, x: Any, info: Any) -> str | None:
        """What is wrong with an example for this guide (None: nothing). `train()` asks it of
        every example before the first model call, so a bad row is named up front instead
        of failing mid-run; override it to say what your guide needs."""
        return None

    async def aget_feedback(self, x: Any, output: Any, info: Any) -> Feedback:
        """`get_feedback` as a coroutine: awaited if async, else run in a worker thread."""
        method = self.get_feedback
        if inspect.iscoroutinefunction(method):
            result = await method(x, output, info)
        else:
            result = await asyncio.to_thread(method, x, output, info)
            if inspect.isawaitable(result):
                result = await result
        return _to_feedback(result, type(self).__name__)


def check_examples(guide: Guide, examples: Sequence[Example], what: str) -> None:
    """Refuse, naming the first bad one, an example that `guide.check_example` finds wrong."""
    check = getattr(guide, "check_example", None)
    if check is None:  # a duck-typed guide that does not subclass Guide
        return
    for index, example in enumerate(examples):
        problem = check(example.x, example.info)
        if problem:
            raise OptoValueError(
                f"{what}: example {index} (id {example.id!r}) cannot be judged by {type(guide).__name__}: {problem}"
            )


def _to_feedback(result: Any, guide: str) -> Feedback:
    """Normalize what a guide returned to a `Feedback`."""
    if isinstance(result, Feedback):
        return result
    if isinstance(result, tuple) and len(result) == 2:
        score, text = result
        return Feedback(score=score, feedback="" if text is None else str(text))
    if result is None or isinstance(result, bool) or not isinstance(result, (int, float)):
        raise OptoTypeError(
            f"{guide}.get_feedback returned {type(result).__name__} {result!r}; return a Feedback, "
            "a (score, feedback) tuple or a number"
        )
    return Feedback(score=result)


class ExactMatchGuide(Guide):
    """Score 1.0 when the output equals an accepted answer, else 0.0.

    `info` is the accepted answer or a list of accepted answers (non-strings are
    compared as `str`). With `normalize=True` both sides are stripped, lower-cased,
    their whitespace runs collapsed to one space, surrounding quotes and a trailing
    period removed, so `' "Three." '` matches `"three"`. The whole output must match:
    an answer buried in a longer reply does not count (have the agent reply with the
    answer only, or post-process its output).
    """

    def __init__(self, normalize: bool = True) -> None:
        self.normalize = normalize

    def check_example(self, x: Any, info: Any) -> str | None:
        """The expected answer must be there: `info` an answer or a non-empty list of them."""
        if info is None:
            return "its info is None, and ExactMatchGuide needs the expected answer there (info=...)"
        if isinstance(info, (list, tuple, set, frozenset)) and not info:
            return "its info is an empty list, and ExactMatchGuide needs at least one accepted answer"
        return None

    def get_feedback(self, x: Any, output: Any, info: Any) -> Feedback:
        """Compare `output` with the accepted answer(s) in `info`."""
        targets = _targets(info)
        text = "" if output is None else str(output)
        prepare = _normalize if self.normalize else (lambda s: s)
        if prepare(text) in {prepare(t) for t in targets}:
            return _CORRECT
        expected = _quote(targets[0])
        if len(targets) > 1:
            expected += " (or " + ", ".join(_quote(t) for t in targets[1:]) + ")"
        return Feedback(score=0.0, feedback=f"Expected {expected}, got {_quote(_shorten(text, 500))}.")

    async def aget_feedback(self, x: Any, output: Any, info: Any) -> Feedback:
        """Exact matching is cheap: run it inline instead of in a thread."""
        return self.get_feedback(x, output, info)


_CORRECT = Feedback(score=1.0, feedback="Correct.")  # frozen: one serves every correct answer


def _targets(info: Any) -> list[str]:
    if info is None:
        raise OptoValueError(
            "ExactMatchGuide needs the example's info to be the expected answer (or a list of accepted answers), "
            "got None"
        )
    targets = [str(t) for t in info] if isinstance(info, (list, tuple, set, frozenset)) else [str(info)]
    if not targets:
        raise OptoValueError("ExactMatchGuide got an empty list of accepted answers in info; give at least one")
    return targets


_QUOTE_PAIRS = {'"': '"', "'": "'", "`": "`", "\u201c": "\u201d", "\u2018": "\u2019"}


def _normalize(text: str) -> str:
    """Lower-case, collapse whitespace, strip surrounding quotes and a trailing period."""
    text = " ".join(text.lower().split())
    if not text or (text[-1] != "." and text[0] not in _QUOTE_PAIRS):  # most answers: nothing to strip
        return text
    while True:
        before = text
        if text.endswith("."):
            text = text[:-1].rstrip()
        if len(text) >= 2 and _QUOTE_PAIRS.get(text[0]) == text[-1]:
            text = text[1:-1].strip()
        if text == before:
            return text


def _quote(text: str) -> str:
    """`text` as a JSON string (what `json.dumps(text, ensure_ascii=False)` gives, without
    building an encoder for every call)."""
    return encode_basestring(text)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


# --- score parsing ---------------------------------------------------------------------

_WORDS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5,
    "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10,
}  # fmt: skip
_NUMBER = r"(?<![\w.])(-?\d+(?:\.\d+)?|" + "|".join(_WORDS) + r")(?![\w])"
_DENOMINATOR = r"(?:\s*(?:/|out\s+of)\s*(-?\d+(?:\.\d+)?))?"
_MARKUP = r"[\s*_`]*"
_LINE_START = r"^[\s*_`#>]*(?:-\s+)?"  # markdown and a "- " bullet; a "-" before a digit is a sign
_SCORE_AFTER = _MARKUP + r"(?:[:=]|is\b|of\b)?" + _MARKUP + _NUMBER + _DENOMINATOR
# "Score: 7" at the start of a line (after markdown, a bullet, "Final"/"Overall").
_SCORE_LINE = re.compile(_LINE_START + r"(?:(?:final|overall|total)\s+)?score\b" + _SCORE_AFTER, re.IGNORECASE)
# "... a score of 7 ..." anywhere in a line.
_SCORE_INLINE = re.compile(r"\bscore\b" + _SCORE_AFTER, re.IGNORECASE)
# A last line that is nothing but a score: "7", "7/10", "seven", "Rating: 7".
_BARE_LINE = re.compile(
    _LINE_START + r"(?:(?:final|overall|total)\s+)?(?:score|rating|grade)?"
    + _MARKUP + r"[:=]?" + _MARKUP + _NUMBER + _DENOMINATOR + r"[\s*_`.!]*$",
    re.IGNORECASE,
)  # fmt: skip


def parse_score(text: str, out_of: float = 10) -> float | None:
    """Read a judge's score (a number from 0 to `out_of`) from its reply; None if there is none.

    Looks, in order of preference, for the last line starting with "Score" (`Score: 7`,
    `**Score:** 7`, `score = 7.5`, `Final score: 7/10`), the last "score ... N" inside a
    line ("a score of 7"), and a last line that is only a score (`7`, `7/10`, `seven`,
    `Rating: 7`). Number words zero..ten count. The value found is returned unscaled, or
    None when it is out of range (e.g. 11, -1) or its denominator is not `out_of`
    ("7/5" with out_of=10): a bad score is rejected, never replaced by another number.
    """
    return _find_score(text, out_of)[0]


def _find_score(text: str, out_of: float) -> tuple[float | None, int | None]:
    """The score and the index of the line that holds only it (None when inline or absent)."""
    lines = text.splitlines()
    for index in reversed(range(len(lines))):
        match = _SCORE_LINE.search(lines[index])
        if match:
            return _value(match, out_of), index
    for index in reversed(range(len(lines))):
        matches = list(_SCORE_INLINE.finditer(lines[index]))
        if matches:
            return _value(matches[-1], out_of), None
    for index in reversed(range(len(lines))):
        if lines[index].strip():
            match = _BARE_LINE.match(lines[index])
            return (_value(match, out_of), index) if match else (None, None)
    return None, None


def _value(match: re.Match[str], out_of: float) -> float | None:
    token, denominator = match.group(1).lower(), match.group(2)
    value = float(_WORDS[token]) if token in _WORDS else float(token)
    if denominator is not None and float(denominator) != out_of:
        return None
    return value if 0 <= value <= out_of else None


# --- LLM judge -------------------------------------------------------------------------


class LLMJudgeGuide(Guide):
    """A model answers `question` about each output and ends its reply with `Score: N`.

    The prompt (`prompts/judge.system.j2` and `prompts/judge.user.j2`, or `template`)
    shows the instance `x`, the reference `info` when it is not None, the output and the
    question. The score is N / `out_of`; the feedback is the judge's reasoning. When a
    reply has no readable score the judge is asked again for just `Score: N`, up to
    `max_generation_retries` times; then the result is `score=None`. A model failure
    (`LLMError`) also gives `score=None` with the error as feedback, except
    `BudgetExceeded`, which is raised so that the run stops.

    Args:
        model: the judge model.
        question: what to judge, e.g. "Does the output answer the question correctly?".
        template: a `PromptTemplate`, or user-template text or a path (keeps the built-in
            system prompt); it gets `x`, `info`, `output`, `question` and `out_of`.
        max_generation_retries: extra requests after a reply without a readable score.
        out_of: the top of the judge's scale (scores run from 0 to `out_of`).
    """

    def __init__(
        self,
        model: Model,
        question: str,
        *,
        template: PromptTemplate | str | Path | None = None,
        max_generation_retries: int = 3,
        out_of: int = 10,
    ) -> None:
        if not hasattr(model, "complete"):
            raise OptoTypeError(f"model must be an opto.llm Model, got {type(model).__name__}")
        if not isinstance(question, str) or not question.strip():
            raise OptoValueError("question must be a non-empty str saying what the judge should assess")
        if isinstance(max_generation_retries, bool) or not isinstance(max_generation_retries, int):
            raise OptoValueError(f"max_generation_retries must be an int >= 0, got {max_generation_retries!r}")
        if max_generation_retries < 0:
            raise OptoValueError(f"max_generation_retries must be an int >= 0, got {max_generation_retries!r}")
        if isinstance(out_of, bool) or not isinstance(out_of, int) or out_of < 1:
            raise OptoValueError(f"out_of must be an int >= 1, got {out_of!r}")
        self.model = model
        self.question = question
        self.template = PromptTemplate.resolve(template, "judge")
        self.max_generation_retries = max_generation_retries
        self.out_of = out_of
        self._messages("x", "output", None)  # a template that needs other variables fails here

    def _messages(self, x: Any, output: Any, info: Any) -> list[dict[str, str]]:
        return self.template.render(x=x, output=output, info=info, question=self.question, out_of=self.out_of)

    async def get_feedback(self, x: Any, output: Any, info: Any) -> Feedback:
        """Ask the judge model; retry when its reply has no readable score."""
        messages: list[dict[str, str]] = list(self._messages(x, output, info))
        replies: list[str] = []
        for _ in range(self.max_generation_retries + 1):
            try:
                completion = await self.model.complete(messages)
            except BudgetExceeded:
                raise
            except LLMError as exc:
                return Feedback(score=None, feedback=f"The judge model failed ({type(exc).__name__}): {exc}")
            reply = completion.text
            replies.append(reply)
            score, line = _find_score(reply, self.out_of)
            if score is not None:
                return Feedback(score=score / self.out_of, feedback=self._reasoning(replies, line, score))
            messages += [
                {"role": "assistant", "content": reply},
                {
                    "role": "user",
                    "content": f"I could not find a valid score in your reply. Reply with just one line: "
                    f"`Score: N`, where N is a number from 0 to {self.out_of}.",
                },
            ]
        return Feedback(
            score=None,
            feedback=f"The judge gave no readable score in {len(replies)} replies (a final line `Score: N` with "
            f"N from 0 to {self.out_of} was expected). Last reply: {_shorten(replies[-1], 1000)!r}",
        )

    def _reasoning(self, replies: list[str], line: int | None, score: float) -> str:
        """The last reply without its score line; the first reply when that leaves nothing."""
        lines = replies[-1].splitlines()
        if line is not None:
            del lines[line]
        reasoning = "\n".join(lines).strip()
        if not reasoning and len(replies) > 1:
            reasoning = replies[0].strip()
        return reasoning or f"The judge gave {score:g}/{self.out_of} without reasoning."
