"""Copies of the data: a candidate that quotes a training example gets no credit for it.

An optimizer shown a failed example often writes the example itself into the prompt
(its input, or its answer): the prompt is then right on that example and on no other,
and a validation that counts it reads memorization as progress (gepa#261). A text value
quotes an example when it holds `words` or more consecutive words of the example's
input, or the example's answer where no example with another input has it (a specific
answer, at least `min_answer` characters; an answer repeated under the same input, as
production logs repeat a question, still belongs to that input's examples).
Decisions and the final check score a candidate without the examples it or the values
it is compared with quote, and the ledger records them (`DecisionEvent.quoted`). Demo
lists (`Demos`) are examples by design and are not searched.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..core.data import Example

__all__ = ["CopyGuard"]

_WORD = re.compile(r"\w+")


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _answers(info: Any) -> list[str]:
    """The answer strings an example's `info` holds (a string, or a list of strings)."""
    if isinstance(info, str):
        return [info]
    if isinstance(info, (list, tuple)):
        return [a for a in info if isinstance(a, str)]
    return []


class CopyGuard:
    """Finds which of `examples` a set of text values quotes (see the module's doc).

    Args:
        examples: every example a decision may score on (training, validation, check).
        words: consecutive words of an input that make a quote.
        min_answer: the shortest answer string that counts when quoted.
    """

    def __init__(self, examples: Iterable[Example], *, words: int = 5, min_answer: int = 4) -> None:
        self.words = words
        self.examples = {e.id or "": e for e in examples}
        # An answer that several inputs share is a label ("yes"), not a quote of one of them.
        pairs = {(_text(e.x), a.strip().lower()) for e in self.examples.values() for a in _answers(e.info)}
        shared = Counter(answer for _, answer in pairs)
        self._answers = {
            key: [a.strip().lower() for a in _answers(e.info) if shared[a.strip().lower()] == 1
                  and len(a.strip()) >= min_answer]
            for key, e in self.examples.items()
        }  # fmt: skip
        self._inputs = {key: self._grams(_words(_text(e.x))) for key, e in self.examples.items()}
        self._cache: dict[str, dict[str, str]] = {}

    def _grams(self, words: Sequence[str]) -> set[tuple[str, ...]]:
        return {tuple(words[i : i + self.words]) for i in range(len(words) - self.words + 1)}

    def quoted(self, values: Mapping[str, Any]) -> dict[str, str]:
        """{example id: what its text quotes} for the string values given."""
        text = "\n".join(v for v in values.values() if isinstance(v, str))
        found = self._cache.get(text)
        if found is not None:
            return found
        lowered = text.lower()
        grams = self._grams(_words(text))
        found = {}
        for key in self.examples:
            if self._inputs[key] & grams:
                found[key] = "its input"
                continue
            answer = next((a for a in self._answers[key] if _contains(lowered, a)), None)
            if answer is not None:
                found[key] = f"its answer {answer!r}"
        if len(self._cache) < 4096:
            self._cache[text] = found
        return found


def _contains(text: str, answer: str) -> bool:
    """`answer` in `text`, not as part of a longer word."""
    return re.search(rf"(?<!\w){re.escape(answer)}(?!\w)", text) is not None
