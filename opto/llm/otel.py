"""Agents in any framework: OpenTelemetry LLM spans become calls of the rollout they ran in.

Frameworks (LangChain/LangGraph, LlamaIndex, CrewAI, the OpenAI Agents SDK) make their
own clients, so `instrument(client)` cannot reach them; their OpenTelemetry
instrumentors can. `trace_otel()` adds a span processor to a tracer provider that reads
every finished span carrying an LLM call, in either convention:

- OpenInference (`openinference.span.kind = "LLM"`; `llm.model_name`,
  `llm.input_messages.N.message.role/content`, `llm.output_messages.N.message...`,
  `llm.token_count.prompt/completion`, `llm.tools.N.tool.json_schema`);
- the OpenTelemetry GenAI conventions (`gen_ai.operation.name = "chat"`;
  `gen_ai.request.model`, `gen_ai.usage.input_tokens/output_tokens`, and the messages in
  `gen_ai.input.messages` / `gen_ai.output.messages` when content capture is on).

Each becomes a call in the trace of the rollout whose context it started in (a span
started in a thread the framework made belongs to the rollout of its parent span), and
counts in the run's usage and budgets. TOOL and RETRIEVER spans become tool results in
the trace (name, input, output). Spans outside any rollout count in usage only.

The rule against counting twice: a span started while opto itself records the call (an
opto `Model`'s request, an `instrument`ed client's call) is left out.

A budget is charged when the span ends, after the call was paid: a call that takes it
over cannot be refused, but the rollout then ends with `BudgetExceeded`, which stops
the run before its next step.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import MissingDependencyError, OptoTypeError, OptoValueError
from .prices import known_price
from .reported import reported_usage
from .tracing import current_trace, is_recorded_by_opto
from .types import ToolCall
from .usage import Budget, UsageMeter, cost_of, current_meters, run_budgets

__all__ = ["OtelTracing", "trace_otel"]

logger = logging.getLogger(__name__)

_LLM_OPERATIONS = {"chat", "text_completion", "generate_content"}
_TOOL_KINDS = {"TOOL", "RETRIEVER"}


@dataclass
class _Owner:
    """Where a span's call goes: a rollout's trace, the meters and budgets of its run."""

    trace: list[dict[str, Any]] | None
    meters: tuple[UsageMeter, ...]
    budgets: tuple[Budget, ...]


def _import_sdk() -> Any:
    try:
        from opentelemetry.sdk import trace as sdk_trace
    except ImportError as exc:
        raise MissingDependencyError("trace_otel needs the OpenTelemetry SDK: pip install 'opto-agents[otel]'") from exc
    return sdk_trace


class OtelTracing:
    """The span processor `trace_otel` installs; `close()` removes it from its provider."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider
        self._owners: dict[int, _Owner | None] = {}  # span id -> owner (None: opto records it itself)
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self.skipped = 0  # spans left out: recorded by opto itself, or unreadable
        self.spans_seen = 0  # every span that ended on the provider, whatever it was

    # The SpanProcessor protocol -------------------------------------------------------

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        owner: _Owner | None
        if is_recorded_by_opto():
            owner = None
        else:
            trace, meters, budgets = current_trace(), current_meters(), run_budgets()
            owner = _Owner(trace, meters, budgets) if trace is not None or meters or budgets else None
            if owner is None and span.parent is not None:  # a thread the framework made: its parent's
                with self._lock:
                    owner = self._owners.get(span.parent.span_id)
            if owner is None:
                owner = _Owner(None, (), ())
        with self._lock:
            self._owners[span.context.span_id] = owner

    def on_end(self, span: Any) -> None:
        with self._lock:
            owner = self._owners.pop(span.context.span_id, _Owner(None, (), ()))
            self.spans_seen += 1
        attributes: Mapping[str, Any] = span.attributes or {}
        kind = _kind(attributes)
        if kind is None:
            return
        if owner is None:
            self.skipped += 1
            return
        try:
            if kind == "llm":
                self._take_call(owner, attributes, span)
            elif owner.trace is not None:
                owner.trace.append({"tool_result": _tool_result(span.name, attributes)})
        except Exception as exc:  # a malformed span is skipped, never a crash in the agent
            self.skipped += 1
            key = f"{kind}:{type(exc).__name__}"
            if key not in self._warned:
                self._warned.add(key)
                logger.warning("skipped an OpenTelemetry %s span (%r) opto could not read: %s", kind, span.name, exc)

    def _on_ending(self, span: Any) -> None:  # the SDK calls it on every processor before on_end
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    # What a span becomes --------------------------------------------------------------

    def _take_call(self, owner: _Owner, attributes: Mapping[str, Any], span: Any) -> None:
        call = _openinference_call(attributes) if "openinference.span.kind" in attributes else _genai_call(attributes)
        model = call["model"]
        usage = reported_usage(call.pop("prompt_tokens"), call.pop("completion_tokens"), source="OpenTelemetry spans")
        price = known_price(model)
        cost = cost_of(usage, price)
        for meter in owner.meters:
            meter.charge(model, usage, cost)
        for budget in owner.budgets:  # after the fact: a used-up budget stops the rollout at its end
            budget.charge(usage, price)
        if owner.trace is not None:
            error = _error_of(span)
            if error:
                call["error"] = error
            owner.trace.append(call)

    def close(self) -> None:
        """Remove the processor: the provider's processors are again exactly what they were.
        A handle that saw no span at all says so: it was attached where nothing writes."""
        if self.spans_seen == 0:
            logger.warning(
                "trace_otel saw no span on its TracerProvider: the instrumentor writes to another provider "
                "(MLflow's tracing keeps one of its own); pass the provider it uses to trace_otel and to the "
                "instrumentor"
            )
        active = self.provider._active_span_processor  # the SDK has no public way to remove one
        with active._lock:
            active._span_processors = tuple(p for p in active._span_processors if p is not self)


def trace_otel(tracer_provider: Any = None) -> OtelTracing:
    """Record OpenTelemetry LLM spans in rollout traces, usage and budgets.

    `tracer_provider` is an SDK `TracerProvider` (default: the global one, which must be
    an SDK provider: `opentelemetry.trace.set_tracer_provider(TracerProvider())`). Give
    the same provider to the framework's instrumentor. `close()` on the returned handle
    removes the processor.
    """
    sdk_trace = _import_sdk()
    if tracer_provider is None:
        from opentelemetry import trace as api_trace

        tracer_provider = api_trace.get_tracer_provider()
    if not isinstance(tracer_provider, sdk_trace.TracerProvider):
        raise OptoTypeError(
            f"trace_otel needs an OpenTelemetry SDK TracerProvider, got {type(tracer_provider).__name__}: create one "
            "(opentelemetry.sdk.trace.TracerProvider()), pass it here and to your instrumentor, or set it globally "
            "with opentelemetry.trace.set_tracer_provider(...)"
        )
    handle = OtelTracing(tracer_provider)
    tracer_provider.add_span_processor(handle)
    return handle


def _kind(attributes: Mapping[str, Any]) -> str | None:
    """ "llm", "tool" or None (a span that is neither, e.g. a chain: only structure)."""
    openinference = attributes.get("openinference.span.kind")
    if openinference == "LLM":
        return "llm"
    if openinference in _TOOL_KINDS or attributes.get("gen_ai.operation.name") == "execute_tool":
        return "tool"
    if openinference is None and attributes.get("gen_ai.operation.name") in _LLM_OPERATIONS:
        return "llm"
    return None


def _indexed(attributes: Mapping[str, Any], prefix: str) -> list[dict[str, Any]]:
    """OpenInference's flattened lists (`prefix.0.message.role`) as a list of nested dicts."""
    found: dict[int, dict[str, Any]] = {}
    for key, value in attributes.items():
        if not key.startswith(prefix + "."):
            continue
        index, _, rest = key[len(prefix) + 1 :].partition(".")
        if index.isdigit():
            _put(found.setdefault(int(index), {}), rest.split("."), value)
    return [found[i] for i in sorted(found)]


def _put(target: dict[str, Any], path: list[str], value: Any) -> None:
    for part in path[:-1]:
        target = target.setdefault(part, {})
    target[path[-1]] = value


def _openinference_call(attributes: Mapping[str, Any]) -> dict[str, Any]:
    messages = []
    for item in _indexed(attributes, "llm.input_messages"):
        message = item.get("message", {})
        entry = {"role": str(message["role"]), "content": message.get("content") or ""}
        calls = _oi_tool_calls(message)
        if calls:
            entry["tool_calls"] = [c.model_dump() for c in calls]
        if message.get("tool_call_id"):
            entry["tool_call_id"] = message["tool_call_id"]
        messages.append(entry)
    outputs = [item.get("message", {}) for item in _indexed(attributes, "llm.output_messages")]
    reply = outputs[0] if outputs else {}
    tools = [
        json.loads(t["tool"]["json_schema"])
        for t in _indexed(attributes, "llm.tools")
        if isinstance(t.get("tool"), dict) and "json_schema" in t["tool"]
    ]
    return _call(
        str(attributes.get("llm.model_name") or attributes.get("llm.request.model_name") or ""),
        messages,
        str(reply.get("content") or ""),
        _oi_tool_calls(reply),
        tools,
        attributes.get("llm.token_count.prompt"),
        attributes.get("llm.token_count.completion"),
        attributes.get("llm.finish_reason"),
    )


def _oi_tool_calls(message: Mapping[str, Any]) -> list[ToolCall]:
    calls = []
    for index in sorted((message.get("tool_calls") or {}), key=int):
        call = message["tool_calls"][index].get("tool_call", {})
        function = call.get("function", {})
        calls.append(
            ToolCall(
                id=str(call.get("id") or ""), name=str(function["name"]), arguments=str(function.get("arguments") or "")
            )
        )
    return calls


def _genai_call(attributes: Mapping[str, Any]) -> dict[str, Any]:
    messages = []
    for message in _json_list(attributes.get("gen_ai.input.messages")):
        parts = message.get("parts") or []
        text = "".join(str(p.get("content", "")) for p in parts if p.get("type") == "text")
        entry: dict[str, Any] = {"role": str(message["role"]), "content": text}
        calls = [_genai_tool_call(p) for p in parts if p.get("type") == "tool_call"]
        if calls:
            entry["tool_calls"] = [c.model_dump() for c in calls]
        results = [p for p in parts if p.get("type") == "tool_call_response"]
        if results:
            entry["role"], entry["content"] = "tool", str(results[0].get("response", ""))
            entry["tool_call_id"] = str(results[0].get("id") or "")
        messages.append(entry)
    outputs = _json_list(attributes.get("gen_ai.output.messages"))
    parts = (outputs[0].get("parts") or []) if outputs else []
    reply = "".join(str(p.get("content", "")) for p in parts if p.get("type") == "text")
    calls = [_genai_tool_call(p) for p in parts if p.get("type") == "tool_call"]
    finish = attributes.get("gen_ai.response.finish_reasons")
    return _call(
        str(attributes.get("gen_ai.response.model") or attributes.get("gen_ai.request.model") or ""),
        messages,
        reply,
        calls,
        [],
        attributes.get("gen_ai.usage.input_tokens"),
        attributes.get("gen_ai.usage.output_tokens"),
        finish[0] if finish else None,
    )


def _genai_tool_call(part: Mapping[str, Any]) -> ToolCall:
    arguments = part.get("arguments")
    return ToolCall(
        id=str(part.get("id") or ""),
        name=str(part["name"]),
        arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
    )


def _json_list(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    found = json.loads(value) if isinstance(value, str) else value
    if not isinstance(found, list):
        raise OptoValueError(f"expected a JSON list of messages, got {type(found).__name__}")
    return found


def _call(
    model: str,
    messages: list[dict[str, Any]],
    reply: str,
    calls: list[ToolCall],
    tools: list[Any],
    prompt_tokens: Any,
    completion_tokens: Any,
    finish: Any,
) -> dict[str, Any]:
    """A trace entry shaped as opto's own calls are (plus the token counts, taken out again)."""
    if not model:
        raise OptoValueError("the span names no model")
    call: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "response": reply,
        "cached": False,
        "source": "opentelemetry",
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
    }
    if calls:
        call["tool_calls"] = [c.model_dump() for c in calls]
    if tools:
        call["tools"] = tools
    if finish == "length":
        call["truncated"] = True
    return call


def _tool_result(name: str, attributes: Mapping[str, Any]) -> dict[str, Any]:
    tool = str(attributes.get("tool.name") or attributes.get("gen_ai.tool.name") or name)
    content, call_id = _tool_output(attributes.get("output.value") or attributes.get("gen_ai.tool.call.result") or "")
    result: dict[str, Any] = {
        "name": tool,
        "tool_call_id": str(attributes.get("gen_ai.tool.call.id") or call_id),
        "content": content,
    }
    given = attributes.get("input.value") or attributes.get("gen_ai.tool.call.arguments")
    if given:
        result["input"] = str(given)
    return result


def _tool_output(output: Any) -> tuple[str, str]:
    """(what the tool returned, its call id): LangChain's instrumentor gives the whole
    serialized ToolMessage ({"type": "tool", "data": {"content", "tool_call_id", ...}})."""
    text = str(output)
    try:
        found = json.loads(text)
    except ValueError:
        return text, ""
    message = found.get("data") if isinstance(found, dict) and isinstance(found.get("data"), dict) else found
    if isinstance(message, dict) and "content" in message:
        return str(message["content"]), str(message.get("tool_call_id") or "")
    return text, ""


def _error_of(span: Any) -> str | None:
    status = getattr(span, "status", None)
    if status is not None and getattr(status.status_code, "name", "") == "ERROR":
        return status.description or "the call failed"
    return None
