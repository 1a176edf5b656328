"""`opto.datasets.traces.read_otlp_json`: OTLP JSON exports, as the OpenTelemetry SDK's own
OTLP encoder writes them, read into `LoggedRollout`s with their feedback, and trained on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from opto import AggregatedUpdate, ExactMatchGuide, Optimizer, ScriptedModel
from opto.datasets.traces import read_otlp_json
from opto.errors import MissingFileError, OptoValueError

sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="the otel extra")
encoder = pytest.importorskip("opentelemetry.exporter.otlp.proto.common.trace_encoder")
from google.protobuf.json_format import MessageToJson  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from test_logged import CAPITALS, RULE, START, Capitals, question  # noqa: E402


def optimizer_reply(messages: list[dict[str, Any]]) -> str:
    """Proposes the rule only when the users' comments are in the prompt."""
    update = RULE if "Recorded feedback:" in messages[-1]["content"] and "wanted the city" in messages[-1]["content"] \
        else "Answer politely."  # fmt: skip
    return json.dumps({"reasoning": "read the feedback", "suggestion": {"prompt": update}})


def export(path: Path, write: Any) -> Path:
    """Spans made by `write(tracer)`, encoded by the SDK's OTLP encoder, as OTLP JSON."""
    memory = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    write(provider.get_tracer("production"))
    path.write_text(MessageToJson(encoder.encode_spans(memory.get_finished_spans())))
    return path


def genai_request(tracer: Any, country: str, verdict: dict[str, Any] | None) -> None:
    """A GenAI-convention request: the messages on the root span, an LLM call under it, and
    the user's verdict as a gen_ai.evaluation.result event."""
    with tracer.start_as_current_span("invoke_agent capitals") as root:
        root.set_attribute("gen_ai.input.messages", json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": question(country)}]}]))  # fmt: skip
        root.set_attribute("gen_ai.output.messages", json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": "It is a lovely place."}]}]))  # fmt: skip
        with tracer.start_as_current_span("chat gpt-4o-mini") as call:
            call.set_attribute("gen_ai.request.model", "gpt-4o-mini")
        if verdict is not None:
            root.add_event("gen_ai.evaluation.result", {f"gen_ai.evaluation.{k}": v for k, v in verdict.items()})


def test_genai_spans_and_their_evaluations_become_records_and_train(tmp_path: Path) -> None:
    def write(tracer: Any) -> None:
        genai_request(tracer, "France", {"name": "user_feedback", "score.label": "thumbs_down",
                                         "explanation": "the user wanted the city"})  # fmt: skip
        genai_request(
            tracer, "Italy", {"name": "rating", "score.value": 0.0, "explanation": "the user wanted the city"}
        )
        genai_request(tracer, "Spain", None)  # no feedback: left out, counted
        with tracer.start_as_current_span("health check"):  # no input or output: left out, counted
            pass

    found = read_otlp_json(export(tmp_path / "traces.json", write))
    assert [r.x for r in found.records] == [question("France"), question("Italy")]
    assert all(r.output == "It is a lovely place." and r.score == 0.0 for r in found.records)
    assert "user_feedback: thumbs_down: the user wanted the city" in found.records[0].feedback
    assert found.without_feedback == 1 and found.without_input_or_output == 1
    assert found.records[0].id and found.records[0].time and found.records[0].time > 1.7e9

    agent = Capitals()
    train = [(question(c), CAPITALS[c]) for c in list(CAPITALS)[4:]]
    result = AggregatedUpdate(agent, Optimizer(ScriptedModel(optimizer_reply))).train(
        ExactMatchGuide(), train, batch_size=4, logged=found.records, progress=False
    )
    assert result.final_parameters["prompt"] == RULE
    assert not [q for q, prompt in agent.ran if q in {question("France"), question("Italy")} and prompt == START]


def test_openinference_spans_with_json_values_and_an_expected_answer(tmp_path: Path) -> None:
    def write(tracer: Any) -> None:
        with tracer.start_as_current_span("agent") as root:
            root.set_attribute("openinference.span.kind", "CHAIN")
            root.set_attribute("input.value", json.dumps({"question": question("Peru")}))
            root.set_attribute("input.mime_type", "application/json")
            root.set_attribute("output.value", "Lima")
            root.set_attribute("expected_answer", "Lima")
            root.add_event("gen_ai.evaluation.result", {"gen_ai.evaluation.name": "thumbs",
                                                        "gen_ai.evaluation.score.value": 1})  # fmt: skip

    (lines := tmp_path / "lines.jsonl").write_text(
        export(tmp_path / "one.json", write).read_text().replace("\n", " ") + "\n"
    )  # the Collector's file exporter: one document per line
    found = read_otlp_json(lines, expected="expected_answer")
    record = found.records[0]
    assert record.x == {"question": question("Peru")} and record.output == "Lima"
    assert record.info == "Lima" and record.score == 1.0 and "thumbs: 1" in record.feedback


def test_what_is_not_an_otlp_export_is_refused_with_where(tmp_path: Path) -> None:
    with pytest.raises(MissingFileError, match="no OTLP JSON export"):
        read_otlp_json(tmp_path / "missing.json")
    (bad := tmp_path / "bad.json").write_text(json.dumps({"spans": []}))
    with pytest.raises(OptoValueError, match="no resourceSpans"):
        read_otlp_json(bad)
    (broken := tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(OptoValueError, match="is not OTLP JSON"):
        read_otlp_json(broken)
