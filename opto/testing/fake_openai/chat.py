"""The chat completions part of `FakeOpenAIServer`: replies, fault injection, rate limits."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union
from urllib.parse import urlsplit

from ...errors import OptoValueError
from ...llm.types import content_text
from .http import RecordedRequest, Response, error, estimate_tokens, json_response, new_id
from .latency import LognormalLatency

__all__ = ["CHAT_PATH", "ChatAPI", "FakeReply", "ReplyResult", "ReplySpec"]

CHAT_PATH = "/v1/chat/completions"


@dataclass
class FakeReply:
    """A fully controlled answer to one chat completion request.

    Attributes:
        texts: one text per choice, or a single text used for every choice.
        finish_reason: reported on every choice (e.g. "length" to simulate truncation).
        status: HTTP status; anything but 200 answers with an OpenAI-shaped error
            whose message is the text(s).
        prompt_tokens: reported usage; estimated from the messages when None (any JSON
            value is sent as it is, so a test can play a server that reports nonsense).
        completion_tokens: reported usage; estimated from the texts when None.
        tool_calls: tool calls every choice asks for, each {"name": ..., "arguments": a dict
            or JSON text} or in OpenAI's wire shape {"id": ..., "type": "function",
            "function": {"name": ..., "arguments": ...}} (as logs and the SDK show them); a
            given "id" is kept, a missing one made up. The finish reason is then
            "tool_calls" and an empty text is sent as content null, as OpenAI does.
    """

    texts: list[str] | str
    finish_reason: str = "stop"
    status: int = 200
    prompt_tokens: Any = None
    completion_tokens: Any = None
    tool_calls: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.tool_calls is not None:
            if not isinstance(self.tool_calls, list):
                raise OptoValueError(
                    f"FakeReply(tool_calls=...) takes a list of tool calls, got "
                    f"{type(self.tool_calls).__name__}; {_TOOL_CALL_SHAPES}"
                )
            self.tool_calls = [_flat_tool_call(call) for call in self.tool_calls]


ReplyResult = Union[str, list[str], FakeReply]
"""What a reply callable may return."""

ReplySpec = Union[None, str, list[str], Callable[[dict[str, Any]], ReplyResult]]
"""What `FakeOpenAIServer(reply=...)` accepts."""


@dataclass(frozen=True)
class _Fault:
    kind: str  # "fail", "hang" or "malformed"
    status: int = 500
    retry_after: float | None = None
    retry_after_ms: int | None = None
    body: Any = None
    seconds: float = 0.0


class ChatAPI:
    """`POST /v1/chat/completions` with scripted replies, queued faults and a rate limit."""

    _lock: threading.Lock

    # Given by RoutedServer, the server this mixes into.
    @property
    def requests(self) -> list[RecordedRequest]:
        raise NotImplementedError

    def _sleep(self, seconds: float) -> bool:
        raise NotImplementedError

    def _init_chat(
        self, reply: ReplySpec, latency: float | LognormalLatency, model: str, rate_limit_rps: float | None
    ) -> None:
        if isinstance(reply, list) and not reply:
            raise OptoValueError("reply list must not be empty")
        if rate_limit_rps is not None and rate_limit_rps <= 0:
            raise OptoValueError(f"rate_limit_rps must be > 0 or None, got {rate_limit_rps}")
        self.reply = reply
        self.latency = latency
        self.model = model
        self.reject_response_format = False
        self.rate_limit_rps = rate_limit_rps
        self._bucket = (max(1.0, rate_limit_rps or 1.0), time.monotonic())  # (tokens, when)
        self._rate_limited = 0
        self._faults: deque[_Fault] = deque()
        self._reply_index = 0
        self._in_flight = 0
        self._peak_in_flight = 0
        self._latencies: list[tuple[Any, float]] = []

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        """The JSON bodies of the `POST /v1/chat/completions` requests, oldest first."""
        return [r.json for r in self.requests if r.method == "POST" and urlsplit(r.path).path == CHAT_PATH]

    @property
    def chat_latencies(self) -> list[tuple[Any, float]]:
        """(JSON body, seconds waited) of each chat request that got past the rate limit,
        in the order they arrived: the latencies the server actually drew."""
        with self._lock:
            return list(self._latencies)

    @property
    def peak_in_flight(self) -> int:
        """The largest number of chat completion requests handled at the same moment."""
        with self._lock:
            return self._peak_in_flight

    def reset_peak_in_flight(self) -> None:
        """Start counting `peak_in_flight` afresh (e.g. after a warm-up)."""
        with self._lock:
            self._peak_in_flight = self._in_flight

    @property
    def rate_limited(self) -> int:
        """Chat requests refused with a 429 by `rate_limit_rps`."""
        with self._lock:
            return self._rate_limited

    def fail_next(
        self,
        n: int = 1,
        status: int = 429,
        retry_after: float | None = None,
        body: Any = None,
        retry_after_ms: int | None = None,
    ) -> None:
        """Answer the next `n` chat requests with an error.

        The body is an OpenAI-shaped error unless `body` is given (a dict or list is
        sent as JSON, str/bytes as is). `retry_after` sets the Retry-After header (seconds),
        `retry_after_ms` the retry-after-ms header the OpenAI SDK also honours.
        """
        fault = _Fault("fail", status=status, retry_after=retry_after, retry_after_ms=retry_after_ms, body=body)
        self._queue(fault, n)

    def hang_next(self, n: int = 1, seconds: float = 30.0) -> None:
        """Make the next `n` chat requests wait `seconds` before answering (to exceed client timeouts)."""
        self._queue(_Fault("hang", seconds=seconds), n)

    def malformed_next(self, n: int = 1) -> None:
        """Answer the next `n` chat requests with a 200 whose body is not valid JSON."""
        self._queue(_Fault("malformed"), n)

    def _queue(self, fault: _Fault, n: int) -> None:
        with self._lock:
            self._faults.extend([fault] * n)

    def _take_token(self) -> float | None:
        """Under `rate_limit_rps`: None if this request may go, else seconds until one may."""
        if self.rate_limit_rps is None:
            return None
        capacity = max(1.0, self.rate_limit_rps)
        with self._lock:
            tokens, then = self._bucket
            now = time.monotonic()
            tokens = min(capacity, tokens + (now - then) * self.rate_limit_rps)
            if tokens >= 1.0:
                self._bucket = (tokens - 1.0, now)
                return None
            self._bucket = (tokens, now)
            self._rate_limited += 1
            return (1.0 - tokens) / self.rate_limit_rps

    def _chat(self, request: RecordedRequest) -> Response | None:
        wait = self._take_token()
        if wait is not None:
            response = error(429, "Rate limit reached for requests (fake server).", code="rate_limit_exceeded")
            response.headers["Retry-After"] = f"{wait:.3f}"
            return response
        with self._lock:
            self._in_flight += 1
            self._peak_in_flight = max(self._peak_in_flight, self._in_flight)
            fault = self._faults.popleft() if self._faults else None
            latency = self.latency.draw() if isinstance(self.latency, LognormalLatency) else self.latency
            self._latencies.append((request.json, latency))
        try:
            if not self._sleep(latency):
                return None
            return self._answer_chat(request.json, fault)
        finally:
            with self._lock:
                self._in_flight -= 1

    def _answer_chat(self, body: Any, fault: _Fault | None) -> Response | None:
        if fault is not None and fault.kind == "fail":
            return self._fault_response(fault)
        if fault is not None and fault.kind == "malformed":
            return Response(200, b'{"id": "chatcmpl-broken", "choices": [{"index": 0, "message": ')
        if fault is not None and fault.kind == "hang" and not self._sleep(fault.seconds):
            return None
        if not isinstance(body, dict):
            return error(400, "The request body must be a JSON object.")
        if self.reject_response_format and "response_format" in body:
            return error(400, "response_format is not supported by this model.", param="response_format")
        if body.get("stream"):
            return error(400, "FakeOpenAIServer does not support stream=True.", param="stream")
        n = body.get("n") or 1
        if not isinstance(n, int) or n < 1:
            return error(400, f"Invalid n: {n!r}", param="n")
        reply = self._make_reply(body, n)
        if isinstance(body.get("stop"), list):  # a reply ends where a stop string would begin
            reply.texts = [_cut_at(text, body["stop"]) for text in reply.texts]
        if reply.status != 200:
            texts = [reply.texts] if isinstance(reply.texts, str) else reply.texts
            return error(reply.status, " ".join(texts))
        return json_response(self._completion(body, reply, n))

    def _fault_response(self, fault: _Fault) -> Response:
        if fault.body is None:
            response = error(fault.status, f"Injected error (status {fault.status}).")
        elif isinstance(fault.body, (dict, list)):
            response = json_response(fault.body, fault.status)
        else:
            raw = fault.body if isinstance(fault.body, bytes) else str(fault.body).encode()
            response = Response(fault.status, raw, content_type="text/plain")
        if fault.retry_after is not None:
            response.headers["Retry-After"] = f"{fault.retry_after:g}"
        if fault.retry_after_ms is not None:
            response.headers["retry-after-ms"] = str(fault.retry_after_ms)
        # As OpenAI does, so a client's errors can carry the request's id.
        response.headers["x-request-id"] = f"req_fake_{len(self.chat_requests)}"
        return response

    def _make_reply(self, body: dict[str, Any], n: int) -> FakeReply:
        """Resolve `self.reply` into a FakeReply with exactly `n` texts."""
        spec = self.reply
        if spec is None:
            users = [m for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "user"]
            result: ReplyResult = "echo: " + (content_text(users[-1].get("content")) if users else "")
        elif isinstance(spec, str):
            result = spec
        elif isinstance(spec, list):
            with self._lock:
                result = spec[min(self._reply_index, len(spec) - 1)]
                self._reply_index += 1
        else:
            result = spec(body)
        reply = result if isinstance(result, FakeReply) else FakeReply(texts=result)
        texts = [reply.texts] * n if isinstance(reply.texts, str) else list(reply.texts)
        if len(texts) != n:
            raise OptoValueError(f"the reply gave {len(texts)} texts but the request asked for n={n}")
        finish = "tool_calls" if reply.tool_calls and reply.finish_reason == "stop" else reply.finish_reason
        return FakeReply(texts, finish, reply.status, reply.prompt_tokens, reply.completion_tokens, reply.tool_calls)

    def _completion(self, body: dict[str, Any], reply: FakeReply, n: int) -> dict[str, Any]:
        prompt = " ".join(content_text(m.get("content")) for m in body.get("messages") or [] if isinstance(m, dict))
        prompt_tokens = reply.prompt_tokens if reply.prompt_tokens is not None else estimate_tokens(prompt)
        completion_tokens = reply.completion_tokens
        if completion_tokens is None:
            completion_tokens = sum(estimate_tokens(text) for text in reply.texts)
        return {
            "id": new_id("chatcmpl"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "system_fingerprint": "fp_fake",
            "choices": [
                {
                    "index": i,
                    "message": _message(text, reply.tool_calls),
                    "logprobs": _logprobs(text) if body.get("logprobs") else None,
                    "finish_reason": reply.finish_reason,
                }
                for i, text in enumerate(reply.texts)
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens
                if isinstance(prompt_tokens, int) and isinstance(completion_tokens, int)
                else None,
            },
        }


def _logprobs(text: str) -> dict[str, Any]:
    """OpenAI's shape of a reply's token logprobs, one made-up token per word."""
    words = [word + " " for word in text.split(" ")] if text else []
    if words:
        words[-1] = words[-1][:-1]
    return {
        "content": [
            {"token": word, "logprob": round(-0.1 * (i + 1), 4), "bytes": list(word.encode()), "top_logprobs": []}
            for i, word in enumerate(words)
        ],
        "refusal": None,
    }


def _cut_at(text: str, stops: list[Any]) -> str:
    ends = [text.find(stop) for stop in stops if isinstance(stop, str) and stop and stop in text]
    return text[: min(ends)] if ends else text


_TOOL_CALL_SHAPES = (
    'a tool call is {"name": "get_weather", "arguments": {"city": "Paris"}} (arguments a dict '
    'or JSON text, "id" optional) or {"id": "call_1", "type": "function", "function": '
    '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}}'
)


def _flat_tool_call(call: Any) -> dict[str, Any]:
    """A scripted tool call as {"id", "name", "arguments" (JSON text)}, from either accepted shape."""
    if isinstance(call, dict) and isinstance(call.get("function"), dict) and call.get("type", "function") == "function":
        inner = call["function"]
        id_, name, arguments = call.get("id"), inner.get("name"), inner.get("arguments", {})
    elif isinstance(call, dict) and "function" not in call:
        id_, name, arguments = call.get("id"), call.get("name"), call.get("arguments", {})
    else:
        raise OptoValueError(f"FakeReply cannot script the tool call {call!r}: {_TOOL_CALL_SHAPES}")
    if (
        not isinstance(name, str)
        or not name
        or not isinstance(arguments, (str, dict))
        or (id_ is not None and not isinstance(id_, str))
    ):
        raise OptoValueError(
            f"FakeReply cannot script the tool call {call!r}: it needs a non-empty name, arguments as "
            f"a dict or JSON text and a text id (or none); {_TOOL_CALL_SHAPES}"
        )
    return {"id": id_, "name": name, "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}


def _message(text: str, tool_calls: list[dict[str, Any]] | None) -> dict[str, Any]:
    if not tool_calls:
        return {"role": "assistant", "content": text, "refusal": None}
    calls = [
        {
            "id": call["id"] or new_id("call"),
            "type": "function",
            "function": {"name": call["name"], "arguments": call["arguments"]},
        }
        for call in tool_calls
    ]
    return {"role": "assistant", "content": text or None, "refusal": None, "tool_calls": calls}
