"""Logged traces as `LoggedRollout`s: what production's agent got, said, and was told.

`read_otlp_json(path)` reads an OTLP JSON export (one `{"resourceSpans": [...]}` document,
or one per line as an OpenTelemetry Collector's file exporter writes them) and makes one
record per trace from its root span:

- the input and output: OpenTelemetry's GenAI conventions (`gen_ai.input.messages`,
  `gen_ai.output.messages`: the last user message's text and the answer's text), else
  OpenInference's (`input.value`, `output.value`, parsed when their mime type is JSON);
- the feedback: every `gen_ai.evaluation.result` event in the trace (GenAI's convention for
  an evaluation: `gen_ai.evaluation.name`, `.score.value`, `.score.label`,
  `.explanation`): scores within [0, 1] and labels such as thumbs up/down become the
  record's score (their mean), every explanation its feedback text;
- an expected answer from a span attribute the caller names (`expected=`), when there is one;
- the trace id, the root span's start time, and the file as its source.

A recorded output is evidence of what the agent did, never a target. Traces with no
input or output, and those with no feedback at all, are counted and left out; the
counts are in the result and in one warning.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ..core.logged import LoggedRollout
from ..errors import MissingFileError, OptoValueError

__all__ = ["TraceRecords", "feedback_score", "read_otlp_json"]

logger = logging.getLogger(__name__)

#: Labels of an evaluation that mean a good or a bad output (lowercased).
GOOD = {"thumbs_up", "thumbs up", "up", "positive", "good", "correct", "pass", "passed", "yes", "true", "helpful"}
BAD = {"thumbs_down", "thumbs down", "down", "negative", "bad", "incorrect", "fail", "failed", "no", "false",
       "unhelpful"}  # fmt: skip


class TraceRecords(BaseModel):
    """What a reader found: the records with a signal, and how many traces it left out, by why."""

    records: list[LoggedRollout] = Field(default_factory=list)
    without_input_or_output: int = 0
    without_feedback: int = 0
    source: str = ""

    @classmethod
    def of(cls, found: Iterable[LoggedRollout | None], source: str) -> TraceRecords:
        """The records a reader made (None: a trace with no input or output), newest last;
        those left out are counted, and said in one warning."""
        kept = cls(source=source)
        for record in found:
            if record is None:
                kept.without_input_or_output += 1
            elif not record.has_signal:
                kept.without_feedback += 1
            else:
                kept.records.append(record)
        kept.records.sort(key=lambda r: r.time or 0.0)
        if kept.without_input_or_output or kept.without_feedback:
            logger.warning("%s", kept.summary())
        return kept

    def summary(self) -> str:
        return (
            f"{len(self.records)} traces with feedback from {self.source}; left out: "
            f"{self.without_input_or_output} without an input or output, {self.without_feedback} without feedback"
        )


def read_otlp_json(path: str | Path, *, expected: str | None = None) -> TraceRecords:
    """The traces of an OTLP JSON export as `LoggedRollout`s (see the module's doc).

    Args:
        path: the export: one OTLP JSON document, or one per line.
        expected: a span attribute that holds the expected answer, where someone gave one.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"no OTLP JSON export at {path}")
    traces: dict[str, list[dict[str, Any]]] = {}
    for span in _spans(path):
        traces.setdefault(str(span.get("traceId", "")), []).append(span)
    return TraceRecords.of((_record(key, spans, expected, str(path)) for key, spans in traces.items()), str(path))


def _spans(path: Path) -> Iterator[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    try:
        documents = [json.loads(text)]
    except json.JSONDecodeError:
        try:
            documents = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise OptoValueError(f"{path} is not OTLP JSON (one document, or one per line): {exc}") from exc
    for document in documents:
        if not isinstance(document, Mapping) or "resourceSpans" not in document:
            raise OptoValueError(f"{path} is not an OTLP JSON trace export: no resourceSpans")
        for resource in document["resourceSpans"] or []:
            for scope in resource.get("scopeSpans") or []:
                yield from scope.get("spans") or []


def _record(trace_id: str, spans: list[dict[str, Any]], expected: str | None, source: str) -> LoggedRollout | None:
    ids = {span.get("spanId") for span in spans}
    roots = [s for s in spans if not s.get("parentSpanId") or s.get("parentSpanId") not in ids]
    root = min(roots or spans, key=lambda s: int(s.get("startTimeUnixNano") or 0))
    ordered = [root, *[s for s in spans if s is not root]]
    x = next((found for found in (_input(_attributes(s)) for s in ordered) if found is not None), None)
    output = next((found for found in (_output(_attributes(s)) for s in ordered) if found is not None), None)
    if x is None or output is None:
        return None
    scores, said = _evaluations(spans)
    info = next((_attributes(s)[expected] for s in ordered if expected and expected in _attributes(s)), None)
    return LoggedRollout(
        x=x,
        output=output,
        score=sum(scores) / len(scores) if scores else None,
        feedback="\n".join(said),
        info=info,
        id=trace_id or None,
        time=int(root.get("startTimeUnixNano") or 0) / 1e9 or None,
        source=source,
    )


def _attributes(holder: Mapping[str, Any]) -> dict[str, Any]:
    return {str(a.get("key")): _value(a.get("value") or {}) for a in holder.get("attributes") or []}


def _value(value: Mapping[str, Any]) -> Any:
    """An OTLP AnyValue as Python."""
    if "stringValue" in value:
        return value["stringValue"]
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "arrayValue" in value:
        return [_value(v) for v in (value["arrayValue"].get("values") or [])]
    if "kvlistValue" in value:
        return {str(kv.get("key")): _value(kv.get("value") or {}) for kv in value["kvlistValue"].get("values") or []}
    return None


def _input(attributes: Mapping[str, Any]) -> Any:
    messages = _json(attributes.get("gen_ai.input.messages"))
    if isinstance(messages, list):
        users = [m for m in messages if isinstance(m, Mapping) and m.get("role") == "user"]
        return _text(users[-1]) if users else None
    return _openinference(attributes, "input")


def _output(attributes: Mapping[str, Any]) -> Any:
    messages = _json(attributes.get("gen_ai.output.messages"))
    if isinstance(messages, list) and messages:
        return _text(messages[-1])
    return _openinference(attributes, "output")


def _openinference(attributes: Mapping[str, Any], kind: str) -> Any:
    value = attributes.get(f"{kind}.value")
    if value is None:
        return None
    if str(attributes.get(f"{kind}.mime_type", "")).endswith("json"):
        parsed = _json(value)
        return parsed if parsed is not None else value
    return value


def _text(message: Mapping[str, Any]) -> Any:
    """A GenAI message's text parts, joined (its parts as they are when none is text)."""
    parts = message.get("parts") or []
    texts = [str(p.get("content", "")) for p in parts if isinstance(p, Mapping) and p.get("type") == "text"]
    return "\n".join(texts) if texts else (parts or message.get("content"))


def _json(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return None


def feedback_score(value: Any, scale: tuple[float, float] | None = None) -> float | None:
    """A feedback value as a score in [0, 1]: a bool, a thumbs label, a number within it (or
    scaled from `scale`, a rating's (lowest, highest)); None when it is none of these (the
    value is then kept as text only)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in GOOD | BAD:
        return 1.0 if value.strip().lower() in GOOD else 0.0
    if isinstance(value, (int, float)) and math.isfinite(value):
        if 0.0 <= value <= 1.0:
            return float(value)
        if scale is not None and scale[1] > scale[0]:
            return min(1.0, max(0.0, (value - scale[0]) / (scale[1] - scale[0])))
    return None


def _evaluations(spans: list[dict[str, Any]]) -> tuple[list[float], list[str]]:
    """The scores (within [0, 1], or from a thumbs label) and the text of every evaluation event."""
    scores: list[float] = []
    said: list[str] = []
    for span in spans:
        for event in span.get("events") or []:
            if event.get("name") != "gen_ai.evaluation.result":
                continue
            found = _attributes(event)
            name = found.get("gen_ai.evaluation.name", "evaluation")
            value, label = found.get("gen_ai.evaluation.score.value"), found.get("gen_ai.evaluation.score.label")
            explanation = str(found.get("gen_ai.evaluation.explanation") or "").strip()
            score = feedback_score(value)
            score = feedback_score(label) if score is None else score
            if score is not None:
                scores.append(score)
            verdict = " ".join(str(v) for v in (label, value) if v is not None)
            line = f"{name}: {verdict}".strip().rstrip(":") + (f": {explanation}" if explanation else "")
            said.append(line)
    return scores, said
