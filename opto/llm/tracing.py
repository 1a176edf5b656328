"""Recording the model calls an agent makes while it runs.

The trainer opens `record_llm_calls()` around each agent run; every `Model.complete`
inside it (in the same task, or in tasks and threads started from it) is appended to
that run's trace, which the optimizer shows to the LLM. An agent that runs tools records
their results with `tool_result`, so the trace holds what the tools returned too.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import OptoValueError
from .context import Scope, current_records
from .types import Completion, Message, ToolCall, content_text, tool_calls_of

__all__ = ["LLMCall", "bounded_trace", "clip_middle", "record_call", "record_llm_calls", "tool_result"]

LLMCall = dict[str, Any]
"""A trace entry. A model call: {"model", "messages", "response", "cached"}, plus
"tool_calls" (a list of {"id", "name", "arguments"}) and "tools" (the tool definitions
offered) when it had them, "truncated": True for a reply cut at max_tokens, and "logprobs"
(the reply's tokens with their logprobs) when the call asked for them. A tool's result: {"tool_result": {"tool_call_id", "name", "content"}}."""


def current_trace() -> list[LLMCall] | None:
    """The trace of the enclosing `record_llm_calls` block (a rollout's), or None."""
    return current_records().trace


def recorded_by_opto() -> Scope[None]:
    """Mark a call that opto records itself, so an OpenTelemetry span of it is not counted again."""
    return Scope(None, by_opto=True)


def is_recorded_by_opto() -> bool:
    return current_records().by_opto


def record_llm_calls() -> Scope[list[LLMCall]]:
    """Collect every model call made inside the block into the yielded list."""
    calls: list[LLMCall] = []
    return Scope(calls, trace=calls)


def record_call(
    model: str, messages: list[Message], completion: Completion, tools: list[dict[str, Any]] | None = None
) -> None:
    """Append one call to the current run's trace (nothing happens outside a run)."""
    calls = current_records().trace
    if calls is not None:
        call: LLMCall = {"model": model, "messages": messages, "response": completion.text, "cached": completion.cached}
        if completion.tool_calls:
            call["tool_calls"] = [c.model_dump() for c in completion.tool_calls]
        if tools:
            call["tools"] = tools
        if completion.truncated:  # cut at max_tokens: never a reply to learn from
            call["truncated"] = True
        if completion.logprobs:  # what RL trains on-policy with
            call["logprobs"] = completion.logprobs
        calls.append(call)


def tool_result(call: ToolCall | dict[str, Any] | Any, result: Any) -> Message:
    """The "tool" message that answers `call` with `result`, recorded in the current trace.

    `call` is a `ToolCall`, a tool call of the OpenAI SDK (or its dict form), or a trace's
    {"id", "name", "arguments"} dict.
    `result` is sent as is when it is a str, else as JSON. Append the returned message to
    the conversation before the next model call::

        reply = await model.complete(messages, tools=TOOLS)
        messages.append(reply.message())
        for call in reply.tool_calls:
            messages.append(tool_result(call, run_tool(call.name, json.loads(call.arguments))))
    """
    if isinstance(call, dict) and "name" in call:
        call = ToolCall(
            id=str(call.get("id") or ""), name=str(call["name"]), arguments=str(call.get("arguments") or "{}")
        )
    elif not isinstance(call, ToolCall):
        found = tool_calls_of({"tool_calls": [call]})
        if not found:
            raise OptoValueError(f"tool_result needs a tool call with a function name, got {call!r}")
        call = found[0]
    content = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
    calls = current_records().trace
    if calls is not None:
        calls.append({"tool_result": {"tool_call_id": call.id, "name": call.name, "content": content}})
    return {"role": "tool", "tool_call_id": call.id, "content": content}


def bounded_trace(trace: list[LLMCall], max_chars: int) -> list[LLMCall]:
    """`trace` made to fit about `max_chars` characters for a prompt, cut in the middle.

    A text longer than a quarter of the bound keeps its start and end around a note of
    what was cut; then, if the whole is still too long, entries are kept from both ends
    and the ones between are replaced by one {"omitted": k} entry. Nothing is dropped
    without a note saying so.
    """
    if max_chars <= 0:
        raise OptoValueError(f"max_chars must be > 0, got {max_chars}")
    text_limit = max(200, max_chars // 4)
    entries = [_clip_entry(entry, text_limit) for entry in trace]
    sizes = [len(json.dumps(entry, ensure_ascii=False, default=str)) for entry in entries]
    if sum(sizes) <= max_chars:
        return entries
    head: list[LLMCall] = []
    tail: list[LLMCall] = []
    low, high, used = 0, len(entries) - 1, 0
    while low <= high:  # alternate ends, so the first and the last calls are kept first
        index = low if len(head) <= len(tail) else high
        if used + sizes[index] > max_chars and (head or tail):
            break
        used += sizes[index]
        if index == low:
            head.append(entries[low])
            low += 1
        else:
            tail.insert(0, entries[high])
            high -= 1
    omitted = high - low + 1
    return head + ([{"omitted": omitted}] if omitted else []) + tail


def clip_middle(text: str, limit: int) -> str:
    """`text` if it fits `limit` characters, else its start and end around a note of the cut."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - 60) // 2
    return f"{text[:keep]}[... {len(text) - 2 * keep} characters cut ...]{text[len(text) - keep :]}"


def _clip_entry(entry: LLMCall, limit: int) -> LLMCall:
    if "tool_result" in entry:
        result = dict(entry["tool_result"])
        result["content"] = clip_middle(str(result.get("content", "")), limit)
        if "input" in result:  # a tool span's input (opto.llm.otel)
            result["input"] = clip_middle(str(result["input"]), limit)
        return {"tool_result": result}
    clipped = dict(entry)
    clipped["messages"] = [
        {**m, "content": clip_middle(content_text(m.get("content")), limit)}
        for m in entry.get("messages") or []
        if isinstance(m, dict)
    ]
    clipped["response"] = clip_middle(str(entry.get("response", "")), limit)
    clipped.pop("tools", None)  # the definitions are the agent's code, not its behaviour: names suffice
    if entry.get("tools"):
        clipped["tool_names"] = [(t.get("function") or {}).get("name") for t in entry["tools"] if isinstance(t, dict)]
    return clipped
