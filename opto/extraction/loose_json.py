"""Reading loose JSON out of free text: the parsers of extraction, from exact to forgiving.

Model replies hold JSON in many shapes: the whole reply, a fenced block, an object in
the middle of prose, a Python literal, JSON with small mistakes, a YAML-style block, or
only some complete `"key": value` pairs. Each parser here yields the values it can read;
what the values *mean* (a suggestion, "no change") is `suggestion.py`'s job. Every value
is bounded (`MAX_DEPTH`) and made safe to store (`json_safe`).
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import json_repair
import yaml

from ..errors import OptoValueError
from ..llm.types import valid_unicode

__all__ = ["MAX_DEPTH", "PARSERS", "json_safe", "parse_exact", "scan_pairs", "to_json_types"]

#: Deeper values are refused: no parameter needs them, and they are a way to exhaust the stack.
MAX_DEPTH = 64
_MAX_SCANS = 100  # brace scans per reply and quoting style; bounds the work on odd replies
_MISSING: Any = object()


def to_json_types(value: Any, depth: int = 0, *, strict: bool = False) -> Any:
    """Tuples and sets (from Python literals) become lists; dict keys become strings.

    Raises ValueError past `MAX_DEPTH` levels, before the stack runs out. With `strict`,
    the result also survives a JSON round trip (`json_safe`): lone surrogates become
    U+FFFD, other non-JSON scalars (a YAML date) their text, and NaN, infinity or a
    number too large to write raise ValueError.
    """
    if depth > MAX_DEPTH:
        raise OptoValueError(f"nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, dict):
        return {_key(k, strict): to_json_types(v, depth + 1, strict=strict) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_json_types(v, depth + 1, strict=strict) for v in value]
    if not strict or value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if value.bit_length() > 10_000:
            raise OptoValueError("a number too large to write")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise OptoValueError(f"{value!r} is not a finite number")
        return value
    return valid_unicode(value if isinstance(value, str) else str(value))


def _key(key: Any, strict: bool) -> str:
    return valid_unicode(str(key)) if strict else str(key)


def json_safe(value: Any) -> Any:
    """`value` as JSON values that survive a round trip; ValueError when it cannot be."""
    return to_json_types(value, strict=True)


def parse_exact(text: str) -> Any:
    """`text` as JSON (raw newlines allowed in strings) or as a Python literal, else `_MISSING`."""
    try:
        return json.loads(text, strict=False)
    except (ValueError, RecursionError):
        pass
    try:
        return to_json_types(ast.literal_eval(text))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _MISSING


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
            yield to_json_types(ast.literal_eval(span))
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


_YAML_BLOCK = re.compile(
    r"^(?P<key>suggestions?|update)[ \t]*:[ \t]*\r?\n(?P<body>(?:[ \t]+\S.*(?:\r?\n|$)|[ \t]*(?:\r?\n))+)", re.MULTILINE
)
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


PARSERS: tuple[tuple[str, Callable[[str], Iterator[Any]]], ...] = (
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
    value = parse_exact(span)
    if value is _MISSING:
        try:
            value = json_repair.loads(span)
        except Exception:  # noqa: BLE001
            return _MISSING
    return value if isinstance(value, kind) else _MISSING


def _scan_value(
    text: str, pos: int, key: str, found: dict[str, Any], known: dict[int, int | None], container: bool
) -> int | None:
    """Record the value of `key` starting at `pos`; return where to go on, None to stop.

    Stopping means the rest of the text is inside a value that never ends (a cut-off reply);
    the object of a `container` key is not recorded but read inside.
    """
    if pos >= len(text):
        return None
    ch = text[pos]
    if ch in "\"'":
        end = _string_end(text, pos, value=True)
        if end is not None:
            found[key] = _unescape(text[pos + 1 : end - 1], ch)
        return end
    if ch == "{" and container:
        return pos + 1  # read the keys inside the suggestion
    if ch in "[{":
        end = _balanced_end(text, pos, "\"'", known)
        if end is None:
            # A cut-off list holds nothing complete; a cut-off object may: read inside it.
            return None if ch == "[" else pos + 1
        value = _parse_container(text[pos:end], list if ch == "[" else dict)
        if value is not _MISSING:
            try:
                found[key] = to_json_types(value)
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


def scan_pairs(text: str, containers: Iterable[str] = ()) -> dict[str, Any]:
    """Every complete ``"key": value`` pair in `text`, left to right (last one wins).

    The pairs inside an object under one of the `containers` keys are read too.

    Values are strings, numbers, booleans, null/None, lists and objects. A value cut off
    by the end of the text (an unclosed string or list, a number with nothing after
    it) is left out, so neighbouring keys are never merged into it.
    """
    found: dict[str, Any] = {}
    known: dict[int, int | None] = {}
    inside = frozenset(containers)
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
            pos = _scan_value(text, value_start, key, found, known, key in inside)
        else:
            pos = end
    return found
