"""What a reply means: the suggested update, "no change" (TERMINATE), or nothing.

`extract_with_method(reply)` runs the loose-JSON parsers (`loose_json.py`) from the most
exact to the most forgiving and reads the first usable value: the values under
"suggestion" (or "suggestions"/"update"), inside one wrapper object (`{"response": ...}`)
or at the top level without the model's bookkeeping keys. `extract_llm_suggestion` is
the same returning only the values.
"""

from __future__ import annotations

import logging
import string
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..core.parameters import _short
from ..errors import OptoError
from ..llm.types import valid_unicode
from .coercion import SkippedValue
from .loose_json import PARSERS, json_safe, parse_exact, scan_pairs, to_json_types

__all__ = [
    "BOOKKEEPING_KEYS",
    "EXTRACTION_METHODS",
    "SUGGESTION_KEYS",
    "WRAPPER_KEYS",
    "Extraction",
    "ExtractionError",
    "extract_llm_suggestion",
    "extract_with_method",
]

logger = logging.getLogger("opto.extraction")

#: The extraction strategies, in the order they are tried.
EXTRACTION_METHODS: tuple[str, ...] = (
    "json",
    "fenced",
    "balanced",
    "python_literal",
    "json_repair",
    "yaml",
    "key_scan",
)

#: Keys that hold the suggestion itself.
SUGGESTION_KEYS: tuple[str, ...] = ("suggestion", "suggestions", "update")
#: Top-level keys that are the model's bookkeeping, never parameter values.
BOOKKEEPING_KEYS: frozenset[str] = frozenset({"reasoning", "answer", "explanation", "thoughts"})
#: Keys some models wrap their whole reply in: {"response": {"reasoning": ..., "suggestion": ...}}.
WRAPPER_KEYS: tuple[str, ...] = ("response", "output", "result", "data", "json")
_EXCERPT_CHARS = 200


class ExtractionError(OptoError, ValueError):
    """No suggestion could be read from a model reply (and it was not TERMINATE)."""

    def __init__(self, response: str) -> None:
        excerpt = response[:_EXCERPT_CHARS] + ("..." if len(response) > _EXCERPT_CHARS else "")
        super().__init__(f"could not extract a suggestion from the reply: {excerpt!r}")
        self.response = response


# ----------------------------------------------------------------- extraction result


@dataclass(frozen=True)
class Extraction:
    """What `extract_with_method` read from a reply.

    Attributes:
        suggestion: parameter name -> suggested value (raw, not yet coerced); empty
            for "no change" and for failure.
        method: the strategy that read the reply (one of `EXTRACTION_METHODS`), or
            None when nothing was parsed (a bare TERMINATE, or failure).
        terminate: True when the model said "no change" (bare TERMINATE, an empty or
            TERMINATE suggestion, or an object with no suggestion keys).
        skipped: values read but left out because no parameter could hold them (NaN or
            infinity, a number too large, nesting deeper than `MAX_DEPTH`).
    """

    suggestion: dict[str, Any]
    method: str | None
    terminate: bool
    skipped: tuple[SkippedValue, ...] = ()

    @property
    def failed(self) -> bool:
        """Neither a suggestion nor a "no change": the caller may ask the model again."""
        return self.method is None and not self.terminate


# A parsed reply read as (suggestion, no_change); None when it is not a usable answer.
_Reading = tuple[dict[str, Any], bool]


def _is_terminate_text(text: str) -> bool:
    """True for TERMINATE alone, allowing whitespace, quotes and punctuation around it."""
    return text.strip(string.whitespace + string.punctuation).upper() == "TERMINATE"


def _is_bookkeeping(key: str) -> bool:
    return key in BOOKKEEPING_KEYS or key.startswith("reasoning_")


def _read_wrapped(value: Any) -> _Reading | None:
    """Read the value found under a "suggestion" key."""
    if isinstance(value, str):
        if not value.strip() or _is_terminate_text(value):
            return {}, True
        value = parse_exact(value.strip())  # a suggestion sent as JSON text
    if value is None or value == []:
        return {}, True
    if isinstance(value, dict):
        return to_json_types(value), not value
    return None


def _read_object(obj: Any, unwrapped: int = 0) -> _Reading | None:
    """Read a parsed reply: the suggestion under a known key, else the top-level keys.

    A reply wrapped in one more object (`{"response": {...}}`, `{"output": {...}}`) is
    read inside it, when the inner object holds the suggestion or is all there is.
    """
    if not isinstance(obj, dict):
        return None
    for key in SUGGESTION_KEYS:
        if key in obj:
            return _read_wrapped(obj[key])
    if unwrapped < 2:
        content = [k for k in obj if not _is_bookkeeping(str(k))]
        for key in WRAPPER_KEYS:
            inner = obj.get(key)
            if isinstance(inner, dict) and (any(k in inner for k in SUGGESTION_KEYS) or content == [key]):
                return _read_object(inner, unwrapped + 1)
    top = {str(k): v for k, v in to_json_types(obj).items() if not _is_bookkeeping(str(k))}
    return top, not top


def _first_reading(candidates: Iterable[Any]) -> _Reading | None:
    """The first candidate holding a suggestion, else the first one meaning "no change"."""
    no_change: _Reading | None = None
    for candidate in candidates:
        try:
            reading = _read_object(candidate)
        except (RecursionError, ValueError):  # absurd nesting: not a reply to read
            continue
        if reading is None:
            continue
        if reading[0]:
            return reading
        no_change = no_change or reading
    return no_change


def _key_scan(text: str) -> dict[str, Any]:
    pairs = scan_pairs(text, SUGGESTION_KEYS)
    return {k: v for k, v in pairs.items() if k not in SUGGESTION_KEYS and not _is_bookkeeping(k)}


def extract_with_method(response: str | None) -> Extraction:
    """Read the suggested update in a model reply and say how it was read.

    Strategies, each tried only when the ones before it found nothing usable:
    ``json`` (the whole reply), ``fenced`` (each ```` ``` ```` block), ``balanced``
    (each top-level ``{...}`` found by a string-aware brace scan), ``python_literal``
    (the same candidates through `ast.literal_eval`), ``json_repair`` (the same
    candidates repaired; only complete objects are repaired, so a cut-off value is
    never completed by guesswork) and ``key_scan`` (complete ``"key": value`` pairs).
    Python literals come before json_repair because `ast.literal_eval` is exact where
    json_repair guesses (it misreads ``'''...'''``, ``r'...'`` and ``'a' 'b'``).

    The values sit under "suggestion" (or "suggestions"/"update"), or at the top level,
    where the bookkeeping keys (reasoning, reasoning_*, answer, explanation, thoughts)
    are dropped. "No change" (``terminate=True``, empty suggestion) is a bare TERMINATE
    reply, a suggestion that is empty or TERMINATE, or an object with no suggestion
    keys. TERMINATE inside a value is just text. A reply that cannot be read gives
    ``method=None, terminate=False`` (see `Extraction.failed`).
    """
    text = (response or "").strip()
    if _is_terminate_text(text):
        return Extraction({}, None, True)
    if not text:
        return Extraction({}, None, False)
    for method, candidates in PARSERS:
        reading = _first_reading(candidates(text))
        if reading is not None:
            return _checked(reading[0], method, reading[1])
    pairs = _key_scan(text)
    if pairs:
        return _checked(pairs, "key_scan", False)
    return Extraction({}, None, False)


def _checked(suggestion: dict[str, Any], method: str, terminate: bool) -> Extraction:
    """The reading with every value made safe to store: lone surrogates become U+FFFD,
    other non-JSON scalars (a YAML date) their text; a value holding NaN or infinity, a
    number too large to write, or nesting deeper than `MAX_DEPTH` is skipped with why."""
    clean: dict[str, Any] = {}
    skipped: list[SkippedValue] = []
    for key, value in suggestion.items():
        name = valid_unicode(str(key))
        try:
            clean[name] = json_safe(value)
        except ValueError as exc:
            skipped.append(SkippedValue(name, _short(value), str(exc)))
    if skipped:
        logger.warning("skipped suggested values: %s", "; ".join(s.describe() for s in skipped))
    if not clean and skipped:
        return Extraction({}, None, False, tuple(skipped))  # nothing usable was read
    return Extraction(clean, method, terminate, tuple(skipped))


def extract_llm_suggestion(response: str | None, ignore_extraction_error: bool = True) -> dict[str, Any]:
    """The suggested update in a model reply: name -> raw value, ``{}`` for "no change".

    See `extract_with_method` for the strategies. When nothing can be read, returns
    ``{}`` and logs a warning, or raises `ExtractionError` when
    `ignore_extraction_error` is False.
    """
    extraction = extract_with_method(response)
    if extraction.failed:
        if not ignore_extraction_error:
            raise ExtractionError(response or "")
        logger.warning("%s; treating it as no change", ExtractionError(response or ""))
    return dict(extraction.suggestion)
