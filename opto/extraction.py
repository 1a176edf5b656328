"""Reading a parameter update out of an optimizer model's reply, and checking it.

Two steps, kept apart so the caller can record each in its ledger:

1. `extract_with_method(reply)` finds the suggested values in the model's text, trying
   a chain of parsers from the most exact to the most forgiving, and reports which one
   worked (`extract_llm_suggestion` is the same thing returning only the values).
2. `construct_update(parameters, suggestion)` coerces each suggested value to its
   parameter's type, validates it, and reports what it had to skip
   (`construct_update_dict` returns only the update, or raises on the first problem).

The expected reply is ``{"reasoning": "...", "suggestion": {name: value, ...}}``; a bare
``TERMINATE`` or an empty suggestion means "no change".
"""

from __future__ import annotations

import ast
import json
import logging
import math
import re
import string
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import json_repair
import yaml

from opto.parameters import Parameter

__all__ = [
    "EXTRACTION_METHODS",
    "Extraction",
    "ExtractionError",
    "SkippedValue",
    "UpdateError",
    "UpdateResult",
    "construct_update",
    "construct_update_dict",
    "extract_llm_suggestion",
    "extract_with_method",
]

logger = logging.getLogger(__name__)

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
#: Deeper values are refused: no parameter needs them, and they are a way to exhaust the stack.
MAX_DEPTH = 64

_EXCERPT_CHARS = 200
_MAX_SCANS = 100  # brace scans per reply and quoting style; bounds the work on odd replies
_MISSING: Any = object()


# --------------------------------------------------------------------------- errors


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ExtractionError(ValueError):
    """No suggestion could be read from a model reply (and it was not TERMINATE)."""

    def __init__(self, response: str) -> None:
        excerpt = response[:_EXCERPT_CHARS] + ("..." if len(response) > _EXCERPT_CHARS else "")
        super().__init__(f"could not extract a suggestion from the reply: {excerpt!r}")
        self.response = response


@dataclass(frozen=True)
class SkippedValue:
    """A suggested value that did not make it into the update, and why."""

    name: str
    value: Any
    reason: str

    def describe(self) -> str:
        return f"{self.name!r} = {_short(self.value)}: {self.reason}"


class UpdateError(ValueError):
    """A suggested value cannot be applied (unknown name, not trainable, bad type or constraint)."""

    def __init__(self, skipped: Iterable[SkippedValue]) -> None:
        self.skipped = list(skipped)
        first = self.skipped[0]
        more = f" (and {len(self.skipped) - 1} more)" if len(self.skipped) > 1 else ""
        super().__init__(f"cannot update parameter {first.describe()}{more}")
        self.name, self.value, self.reason = first.name, first.value, first.reason


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


def _to_json_types(value: Any, depth: int = 0) -> Any:
    """Tuples and sets (from Python literals) become lists; dict keys become strings.

    Raises ValueError past `MAX_DEPTH` levels, before the stack runs out.
    """
    if depth > MAX_DEPTH:
        raise ValueError(f"nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, dict):
        return {str(k): _to_json_types(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_to_json_types(v, depth + 1) for v in value]
    return value


def _parse_exact(text: str) -> Any:
    """`text` as JSON (raw newlines allowed in strings) or as a Python literal, else `_MISSING`."""
    try:
        return json.loads(text, strict=False)
    except (ValueError, RecursionError):
        pass
    try:
        return _to_json_types(ast.literal_eval(text))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _MISSING


def _read_wrapped(value: Any) -> _Reading | None:
    """Read the value found under a "suggestion" key."""
    if isinstance(value, str):
        if not value.strip() or _is_terminate_text(value):
            return {}, True
        value = _parse_exact(value.strip())  # a suggestion sent as JSON text
    if value is None or value == []:
        return {}, True
    if isinstance(value, dict):
        return _to_json_types(value), not value
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
    top = {str(k): v for k, v in _to_json_types(obj).items() if not _is_bookkeeping(str(k))}
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


# ------------------------------------------------------------------------- scanning


def _bracket_matches(text: str, start: int, quotes: str) -> dict[int, int | None]:
    """Scan from the bracket at `start` until it closes, skipping quoted strings.

    Returns, for that bracket and every same-kind bracket met outside strings on the
    way, the index just past its closing bracket (None when it never closes). One scan
    answers for all of them, which keeps a cut-off reply from costing a scan per brace.
    """
    opener = text[start]
    closer = "}" if opener == "{" else "]"
    matches: dict[int, int | None] = {}
    stack: list[int] = []
    quote, i = "", start
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in quotes:
            quote = ch
        elif ch == opener:
            stack.append(i)
        elif ch == closer and stack:
            matches[stack.pop()] = i + 1
            if not stack:
                return matches
        i += 1
    matches.update(dict.fromkeys(stack))
    return matches


def _balanced_end(text: str, start: int, quotes: str, known: dict[int, int | None]) -> int | None:
    """Index just past the bracket closing the one at `start`, None when it never closes.

    `known` caches the answers of earlier scans of the same text and quoting style.
    """
    if start not in known:
        for bracket, close in _bracket_matches(text, start, quotes).items():
            known.setdefault(bracket, close)
    return known[start]


def _previous_index(text: str, pos: int) -> int:
    """Index of the last non-whitespace character before `pos`, -1 when there is none."""
    pos -= 1
    while pos >= 0 and text[pos].isspace():
        pos -= 1
    return pos


def _is_nested_value(text: str, start: int, in_unclosed: bool) -> bool:
    """Whether the ``{`` at `start` is a value inside a larger object, not a reply of its own.

    It is after ``"key":``; or, inside an object that never closes (a cut-off reply),
    after ``[`` or ``,``.
    """
    before = _previous_index(text, start)
    if before < 0:
        return False
    if text[before] == ":":
        key_end = _previous_index(text, before)
        return key_end >= 0 and text[key_end] in "\"'"
    return in_unclosed and text[before] in "[,"


def _object_spans(text: str, quotes: str) -> Iterator[str]:
    """Each top-level balanced ``{...}`` in order.

    An unclosed ``{`` is passed over (it may be prose, or a cut-off reply); the objects
    inside a cut-off reply are values of its keys, not replies, and are not offered.
    """
    known: dict[int, int | None] = {}
    start = text.find("{")
    scans, in_unclosed = 0, False
    while start != -1:
        if start not in known:  # the first brace, or one inside a string of an earlier scan
            scans += 1
            if scans > _MAX_SCANS:
                return
        end = _balanced_end(text, start, quotes, known)
        if end is None:
            in_unclosed = True
            start = text.find("{", start + 1)
        elif _is_nested_value(text, start, in_unclosed):
            start = text.find("{", start + 1)
        else:
            yield text[start:end]
            start = text.find("{", end)


# ----------------------------------------------------------------------- strategies

_FENCE = re.compile(r"```[ \t]*[\w+-]*[ \t]*\r?\n?(.*?)```", re.DOTALL)


def _json_values(texts: Iterable[str]) -> Iterator[Any]:
    for text in texts:
        try:
            yield json.loads(text, strict=False)
        except (ValueError, RecursionError):
            continue


def _strict_json(text: str) -> Iterator[Any]:
    return _json_values([text])


def _fenced_json(text: str) -> Iterator[Any]:
    return _json_values(match.group(1).strip() for match in _FENCE.finditer(text))


def _balanced_json(text: str) -> Iterator[Any]:
    return _json_values(_object_spans(text, '"'))


def _python_literals(text: str) -> Iterator[Any]:
    for span in _object_spans(text, "\"'"):
        try:
            yield _to_json_types(ast.literal_eval(span))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue


def _repaired(text: str) -> Iterator[Any]:
    """json_repair on complete objects only, so it never invents the end of a cut-off value."""
    seen: set[str] = set()
    for span in [*_object_spans(text, '"'), *_object_spans(text, "\"'")]:
        if span in seen or ":" not in span:
            continue
        seen.add(span)
        try:
            repaired = json_repair.loads(span)
        except Exception:  # noqa: BLE001 - a repair that crashes is a repair that failed
            continue
        if isinstance(repaired, dict) and repaired:
            yield repaired


_YAML_BLOCK = re.compile(r"^(?P<key>suggestions?|update)[ \t]*:[ \t]*\r?\n(?P<body>(?:[ \t]+\S.*(?:\r?\n|$)|[ \t]*(?:\r?\n))+)",
                         re.MULTILINE)
_YAML_CHARS = 20_000  # longer blocks are not parsed: YAML parsing is slow on large hostile input


class _NoAliasLoader(yaml.SafeLoader):
    """yaml.SafeLoader without anchors and aliases (they can expand a short text enormously)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.YAMLError("aliases are not read in model replies")
        return super().compose_node(parent, index)


def _yaml_blocks(text: str) -> Iterator[Any]:
    """YAML-style replies: a `suggestion:` line, then indented `name: value` lines."""
    for match in _YAML_BLOCK.finditer(text):
        body = match.group("body")
        if len(body) > _YAML_CHARS:
            continue
        try:
            value = yaml.load(f"{match.group('key')}:\n{body}", Loader=_NoAliasLoader)  # noqa: S506 - safe loader
        except (yaml.YAMLError, RecursionError, ValueError):
            continue
        if isinstance(value, dict):
            yield value


_PARSERS: tuple[tuple[str, Callable[[str], Iterator[Any]]], ...] = (
    ("json", _strict_json),
    ("fenced", _fenced_json),
    ("balanced", _balanced_json),
    ("python_literal", _python_literals),
    ("json_repair", _repaired),
    ("yaml", _yaml_blocks),
)


# ------------------------------------------------------------------------- key scan

_NUMBER = re.compile(r"""[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?(?=[ \t]*[,}\]\r\n"'])""")
_LITERAL = re.compile(r"(true|false|True|False|null|None)(?![\w.])")
_LITERALS = {"true": True, "True": True, "false": False, "False": False, "null": None, "None": None}
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|.)", re.DOTALL)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "0": "\0"}


def _unescape(body: str, quote: str) -> str:
    """Decode a quoted string's body; an unknown escape such as ``\\d`` is kept as is."""
    if quote == '"':
        try:
            return json.loads(f'"{body}"', strict=False)
        except ValueError:
            pass

    def replace(match: re.Match[str]) -> str:
        code = match.group(1)
        if code.startswith("u") and len(code) == 5:
            return chr(int(code[1:], 16))
        if code in _ESCAPES:
            return _ESCAPES[code]
        return code if code in "\\/\"'" else match.group(0)

    return _ESCAPE.sub(replace, body)


def _followed_by_delimiter(text: str, pos: int) -> bool:
    """A value ends here: end of text, or (after spaces) a comma, bracket, newline or quote."""
    while pos < len(text) and text[pos] in " \t":
        pos += 1
    return pos == len(text) or text[pos] in ",}]\r\n\"'"


def _string_end(text: str, start: int, *, value: bool) -> int | None:
    """Index past the closing quote of the string at `start`, None when it never closes.

    For a value, a quote not followed by a delimiter is taken as an unescaped quote
    inside the text (``"Use 5" screens"``) and the scan goes on.
    """
    quote, i = text[start], start + 1
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == quote and (not value or _followed_by_delimiter(text, i + 1)):
            return i + 1
        i += 1
    return None


def _next_string(text: str, pos: int) -> int | None:
    """Where the next quoted string starts; a ``'`` only counts after ``{`` or ``,``.

    That keeps apostrophes in prose ("Here's the fix") from being read as strings.
    """
    for i in range(pos, len(text)):
        ch = text[i]
        if ch == '"':
            return i
        if ch == "'":
            before = _previous_index(text, i)
            if before < 0 or text[before] in "{,":
                return i
    return None


def _parse_container(span: str, kind: type) -> Any:
    value = _parse_exact(span)
    if value is _MISSING:
        try:
            value = json_repair.loads(span)
        except Exception:  # noqa: BLE001
            return _MISSING
    return value if isinstance(value, kind) else _MISSING


def _scan_value(
    text: str, pos: int, key: str, found: dict[str, Any], known: dict[int, int | None]
) -> int | None:
    """Record the value of `key` starting at `pos`; return where to go on, None to stop.

    Stopping means the rest of the text is inside a value that never ends (a cut-off reply).
    """
    if pos >= len(text):
        return None
    ch = text[pos]
    if ch in "\"'":
        end = _string_end(text, pos, value=True)
        if end is not None:
            found[key] = _unescape(text[pos + 1 : end - 1], ch)
        return end
    if ch == "{" and key in SUGGESTION_KEYS:
        return pos + 1  # read the keys inside the suggestion
    if ch in "[{":
        end = _balanced_end(text, pos, "\"'", known)
        if end is None:
            # A cut-off list holds nothing complete; a cut-off object may: read inside it.
            return None if ch == "[" else pos + 1
        value = _parse_container(text[pos:end], list if ch == "[" else dict)
        if value is not _MISSING:
            try:
                found[key] = _to_json_types(value)
            except ValueError:
                pass  # too deep to be a parameter value
        return end
    if number := _NUMBER.match(text, pos):
        token = number.group(0)
        try:
            found[key] = int(token) if re.fullmatch(r"[-+]?\d+", token) else float(token)
        except ValueError:  # more digits than int() converts (sys.get_int_max_str_digits)
            found[key] = float(token)  # inf: dropped by the final check, with the reason
        return number.end()
    if literal := _LITERAL.match(text, pos):
        found[key] = _LITERALS[literal.group(1)]
        return literal.end()
    return pos


def _scan_pairs(text: str) -> dict[str, Any]:
    """Every complete ``"key": value`` pair in `text`, left to right (last one wins).

    Values are strings, numbers, booleans, null/None, lists and objects. A value cut off
    by the end of the text (an unclosed string or list, a number with nothing after
    it) is left out, so neighbouring keys are never merged into it.
    """
    found: dict[str, Any] = {}
    known: dict[int, int | None] = {}
    pos: int | None = 0
    while pos is not None and pos < len(text):
        start = _next_string(text, pos)
        if start is None:
            break
        end = _string_end(text, start, value=False)
        if end is None:  # a stray quote, or a string cut off by the end of the reply
            pos = start + 1
            continue
        colon = end
        while colon < len(text) and text[colon] in " \t":
            colon += 1
        if colon < len(text) and text[colon] == ":":
            key = _unescape(text[start + 1 : end - 1], text[start])
            value_start = colon + 1
            while value_start < len(text) and text[value_start].isspace():
                value_start += 1
            pos = _scan_value(text, value_start, key, found, known)
        else:
            pos = end
    return found


def _key_scan(text: str) -> dict[str, Any]:
    pairs = _scan_pairs(text)
    return {k: v for k, v in pairs.items() if k not in SUGGESTION_KEYS and not _is_bookkeeping(k)}


# ---------------------------------------------------------------------- public: read


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
    for method, candidates in _PARSERS:
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
        name = _valid_text(str(key))
        try:
            clean[name] = _json_safe(value, 0)
        except ValueError as exc:
            skipped.append(SkippedValue(name, _short(value), str(exc)))
    if skipped:
        logger.warning("skipped suggested values: %s", "; ".join(s.describe() for s in skipped))
    if not clean and skipped:
        return Extraction({}, None, False, tuple(skipped))  # nothing usable was read
    return Extraction(clean, method, terminate, tuple(skipped))


def _valid_text(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def _json_safe(value: Any, depth: int) -> Any:
    """`value` as JSON values that survive a round trip; ValueError when it cannot be."""
    if depth > MAX_DEPTH:
        raise ValueError(f"nested more than {MAX_DEPTH} levels deep")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if value.bit_length() > 10_000:
            raise ValueError("a number too large to write")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a finite number")
        return value
    if isinstance(value, str):
        return _valid_text(value)
    if isinstance(value, dict):
        return {_valid_text(str(k)): _json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_json_safe(v, depth + 1) for v in value]
    return _valid_text(str(value))


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


# -------------------------------------------------------------------- coercion


_TRUE_WORDS = frozenset({"true", "yes", "1"})
_FALSE_WORDS = frozenset({"false", "no", "0"})


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
    raise ValueError(f"cannot read {_short(value)} as a bool")


def _to_int(value: Any) -> int:
    number = value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            try:
                number = float(value.strip())
            except ValueError:
                raise ValueError(f"cannot read {_short(value)} as an int") from None
    if isinstance(number, bool):
        raise ValueError(f"{value!r} is a bool, not an int")
    if isinstance(number, int):
        return number
    if isinstance(number, float):
        if math.isfinite(number) and number.is_integer():
            return int(number)
        raise ValueError(f"{_short(value)} is not a whole number")
    raise ValueError(f"cannot read {_short(value)} as an int")


def _to_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is a bool, not a number")
    try:
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            return float(value.strip())
    except (ValueError, OverflowError):
        pass
    raise ValueError(f"cannot read {_short(value)} as a number")


def _to_str(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return json.dumps(value, ensure_ascii=False, default=str)


def _to_container(kind: type) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if isinstance(value, str):
            value = _parse_exact(value.strip())
        if kind is list and isinstance(value, tuple):
            value = list(value)
        if isinstance(value, kind):
            return value
        raise ValueError(f"cannot read {_short(value)} as a {kind.__name__}")

    return convert


_COERCIONS: dict[type, Callable[[Any], Any]] = {
    bool: _to_bool,
    int: _to_int,
    float: _to_float,
    str: _to_str,
    list: _to_container(list),
    dict: _to_container(dict),
}


def _coerce(param: Parameter, value: Any) -> Any:
    """`value` converted to the parameter's type and validated; ValueError says why not."""
    if value is None:
        raise ValueError("no value (None)")
    return param.validate(_COERCIONS[param.type](value))


def _same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (so True is not 1)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


# ---------------------------------------------------------------- public: update


@dataclass
class UpdateResult:
    """The checked update (name -> value) and the suggested values left out of it."""

    update: dict[str, Any] = field(default_factory=dict)
    skipped: list[SkippedValue] = field(default_factory=list)


def _by_name(parameters: Mapping[str, Parameter] | Iterable[Parameter]) -> dict[str, Parameter]:
    if isinstance(parameters, Mapping):
        return {str(name): param for name, param in parameters.items()}
    named: dict[str, Parameter] = {}
    for param in parameters:
        if param.name is None:
            raise ValueError(f"{param!r} has no name; pass a mapping of name -> Parameter")
        if named.get(param.name, param) is not param:
            raise ValueError(f"two parameters are named {param.name!r}")
        named[param.name] = param
    return named


def _check(parameters: Mapping[str, Parameter] | Iterable[Parameter], suggestion: Mapping[str, Any]) -> UpdateResult:
    named = _by_name(parameters)
    result = UpdateResult()
    for name, value in suggestion.items():
        param = named.get(name)
        if param is None:
            reason = "not a parameter name"
        elif not param.trainable:
            reason = "the parameter is not trainable"
        else:
            try:
                accepted = _coerce(param, value)
            except ValueError as exc:  # ParameterError is a ValueError
                reason = str(exc)
            else:
                if not _same(accepted, param.stored_value):
                    result.update[name] = accepted
                continue
        result.skipped.append(SkippedValue(str(name), value, reason))
    return result


def construct_update(
    parameters: Mapping[str, Parameter] | Iterable[Parameter], suggestion: Mapping[str, Any]
) -> UpdateResult:
    """Check a suggestion against the parameters; each skipped value is logged as a warning.

    `parameters` is a mapping name -> Parameter, or Parameters that all have names. Each
    suggested value is converted to its parameter's type, then `Parameter.validate`d:

    - bool: a bool; 0 or 1; "true"/"false"/"yes"/"no"/"1"/"0" in any case.
    - int: an int; a float or numeric string only when whole ("4.0" -> 4; 4.5 is refused).
    - float: an int or float; a numeric string.
    - str: a str as is; a number as ``str(number)``; anything else (bool, list, dict)
      as JSON text, e.g. ``["a", "b"]`` -> ``'["a", "b"]'``.
    - list / dict: a list / dict, or a string holding one as JSON or a Python literal.

    Skipped, with the reason: names that are not parameters, parameters that are not
    trainable, None, values that cannot be converted, values that fail validation.
    Values equal to the parameter's stored value are left out silently (a no-op).
    """
    result = _check(parameters, suggestion)
    for item in result.skipped:
        logger.warning("skipped suggested value %s", item.describe())
    return result


def construct_update_dict(
    parameters: Mapping[str, Parameter] | Iterable[Parameter],
    suggestion: Mapping[str, Any],
    ignore_extraction_error: bool = True,
) -> dict[str, Any]:
    """The checked update, name -> value, as `construct_update` builds it.

    With `ignore_extraction_error` False, any value that would be skipped raises
    `UpdateError` naming the parameter, the value and the reason instead.
    """
    if ignore_extraction_error:
        return construct_update(parameters, suggestion).update
    result = _check(parameters, suggestion)
    if result.skipped:
        raise UpdateError(result.skipped)
    return result.update
