"""An in-process fake of the OpenAI HTTP API, for offline tests.

`FakeOpenAIServer` is a real HTTP server on 127.0.0.1 (standard library only) that
speaks the parts of the OpenAI API this project uses: chat completions, file
uploads and fine-tuning jobs. Point any OpenAI client at `server.base_url`::

    with FakeOpenAIServer(reply="hello") as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test")
        ...
        assert server.chat_requests[0]["model"] == "gpt-4o-mini"

Faults (rate limits, server errors, hangs, broken bodies) can be queued for the
next chat completion requests, so retry and timeout handling can be tested
without a network.
"""

from __future__ import annotations

import copy
import email.parser
import email.policy
import json
import re
import socket
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Union
from urllib.parse import urlsplit

__all__ = ["FakeOpenAIServer", "FakeReply", "RecordedRequest", "StoredFile"]

CHAT_PATH = "/v1/chat/completions"

# Error `type`/`code` OpenAI uses for the common statuses, so clients that branch on them behave.
_ERROR_KINDS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "permission_denied"),
    404: ("invalid_request_error", "not_found"),
    429: ("requests", "rate_limit_exceeded"),
}

_TERMINAL_JOB_STATUSES = ("succeeded", "failed", "cancelled")


@dataclass
class FakeReply:
    """A fully controlled answer to one chat completion request.

    Attributes:
        texts: one text per choice, or a single text used for every choice.
        finish_reason: reported on every choice (e.g. "length" to simulate truncation).
        status: HTTP status; anything but 200 answers with an OpenAI-shaped error
            whose message is the text(s).
        prompt_tokens: reported usage; estimated from the messages when None.
        completion_tokens: reported usage; estimated from the texts when None.
    """

    texts: list[str] | str
    finish_reason: str = "stop"
    status: int = 200
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


ReplyResult = Union[str, list[str], FakeReply]
"""What a reply callable may return."""

ReplySpec = Union[None, str, list[str], Callable[[dict[str, Any]], ReplyResult]]
"""What `FakeOpenAIServer(reply=...)` accepts."""


@dataclass(frozen=True)
class RecordedRequest:
    """One HTTP request as the server received it.

    Attributes:
        method: "GET", "POST", ...
        path: the request target, including any query string.
        headers: header names lowercased.
        json: the parsed JSON body, or None when the body is empty or not JSON.
        body: the raw body bytes (useful for multipart uploads).
    """

    method: str
    path: str
    headers: dict[str, str]
    json: Any
    body: bytes


@dataclass(frozen=True)
class StoredFile:
    """A file uploaded through `POST /v1/files`."""

    id: str
    filename: str
    purpose: str
    content: bytes
    created_at: int

    def to_json(self) -> dict[str, Any]:
        """The OpenAI `FileObject` representation."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.content),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
            "expires_at": None,
        }


@dataclass(frozen=True)
class _Fault:
    kind: str  # "fail", "hang" or "malformed"
    status: int = 500
    retry_after: float | None = None
    retry_after_ms: int | None = None
    body: Any = None
    seconds: float = 0.0


@dataclass
class _Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


def _json_response(payload: Any, status: int = 200) -> _Response:
    return _Response(status, json.dumps(payload).encode())


def _error(status: int, message: str, *, code: str | None = None, param: str | None = None) -> _Response:
    """An error response in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""
    default_type, default_code = _ERROR_KINDS.get(status, ("server_error", None))
    error = {"message": message, "type": default_type, "param": param, "code": code or default_code}
    return _json_response({"error": error}, status)


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def _text_of(content: Any) -> str:
    """The text of a message `content`, which is a string or a list of typed parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _estimate_tokens(text: str) -> int:
    """A rough token count (about four characters per token, like OpenAI's rule of thumb)."""
    return (len(text) + 3) // 4


def _parse_multipart(body: bytes, content_type: str) -> dict[str, tuple[str | None, bytes]]:
    """Parse a multipart/form-data body into {field name: (filename, content)}."""
    header = email.parser.Parser(policy=email.policy.HTTP).parsestr(f"Content-Type: {content_type}\r\n\r\n")
    boundary = header.get_param("boundary")
    if not isinstance(boundary, str):
        raise ValueError("multipart body without a boundary")
    # Each part is preceded by CRLF--boundary; prefixing a CRLF makes the first one uniform.
    chunks = (b"\r\n" + body).split(b"\r\n--" + boundary.encode())
    fields: dict[str, tuple[str | None, bytes]] = {}
    for chunk in chunks[1:]:
        if chunk.startswith(b"--"):  # the closing delimiter
            break
        head, _, content = chunk.partition(b"\r\n\r\n")
        part = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head.lstrip(b" \t\r\n") + b"\r\n\r\n")
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str):
            fields[name] = (part.get_filename(), content)
    return fields


class FakeOpenAIServer:
    """A real HTTP server on 127.0.0.1 that imitates the OpenAI API.

    Routes: `POST /v1/chat/completions`, `POST /v1/files`, `GET /v1/files`,
    `GET /v1/files/{id}`, `GET /v1/files/{id}/content`, `POST /v1/fine_tuning/jobs`,
    `GET /v1/fine_tuning/jobs`, `GET /v1/fine_tuning/jobs/{id}`,
    `GET /v1/fine_tuning/jobs/{id}/events`, `POST /v1/fine_tuning/jobs/{id}/cancel`.
    Anything else gets a 404 error. Every request is recorded, faulted ones included.

    Args:
        reply: how chat completions answer. None echoes "echo: <last user message>";
            a str is always returned; a list of str is returned in order, repeating the
            last one; a callable receives the request JSON and returns a str (used for
            every choice), a list of str (one per choice) or a `FakeReply`.
        latency: seconds each chat request waits before answering (settable later).
        model: the model reported when a request names none.
        port: the port to listen on; 0 picks a free one.
        rate_limit_rps: when set, chat requests beyond this many per second (a token
            bucket holding one second's worth) get a 429 with a Retry-After header
            saying when the next one would be accepted; `rate_limited` counts them.

    Attributes:
        latency: see above.
        reject_response_format: when True, chat requests with `response_format`
            get a 400 invalid_request_error.
        job_script: the statuses a new fine-tuning job walks through, one per
            `GET /v1/fine_tuning/jobs/{id}`; copied when the job is created.
        job_failure_error: the `error` of a job whose script reaches "failed".
    """

    def __init__(
        self,
        reply: ReplySpec = None,
        *,
        latency: float = 0.0,
        model: str = "fake-model",
        port: int = 0,
        rate_limit_rps: float | None = None,
    ) -> None:
        if isinstance(reply, list) and not reply:
            raise ValueError("reply list must not be empty")
        if rate_limit_rps is not None and rate_limit_rps <= 0:
            raise ValueError(f"rate_limit_rps must be > 0 or None, got {rate_limit_rps}")
        self.reply = reply
        self.latency = latency
        self.model = model
        self.reject_response_format = False
        self.job_script: list[str] = ["validating_files", "queued", "running", "succeeded"]
        self.job_failure_error: dict[str, Any] = {
            "code": "invalid_training_file",
            "message": "The training file is not valid (fake failure).",
            "param": "training_file",
        }
        self.rate_limit_rps = rate_limit_rps
        self._bucket = (max(1.0, rate_limit_rps or 1.0), time.monotonic())  # (tokens, when)
        self._rate_limited = 0
        self._port = port
        # One lock guards all mutable state; it is never held while sleeping or calling `reply`.
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._requests: list[RecordedRequest] = []
        self._faults: deque[_Fault] = deque()
        self._reply_index = 0
        self._in_flight = 0
        self._peak_in_flight = 0
        self._files: dict[str, StoredFile] = {}
        self._jobs: dict[str, dict[str, Any]] = {}
        self._job_progress: dict[str, tuple[list[str], int]] = {}  # id -> (script, step)
        self._job_events: dict[str, list[dict[str, Any]]] = {}
        self._job_training_tokens: dict[str, int] = {}
        self._ft_create_refusal: tuple[int, str] | None = None
        self._connections: set[socket.socket] = set()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> FakeOpenAIServer:
        """Start serving in a daemon thread; returns self."""
        if self._httpd is not None:
            raise RuntimeError("FakeOpenAIServer is already started")
        self._stopping.clear()
        self._httpd = _HTTPServer(("127.0.0.1", self._port), _Handler)
        self._httpd.fake = self
        # A short poll interval keeps `stop()` (which waits for the serve loop) fast.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="FakeOpenAIServer", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving. Returns promptly: sleeping handlers wake up and open connections are closed."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        # Idle keep-alive connections block their handler threads in a read; closing them frees the threads.
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- inspection ----------------------------------------------------------

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, e.g. "http://127.0.0.1:54321/v1"."""
        if self._httpd is None:
            raise RuntimeError("FakeOpenAIServer is not running; call start() or use it as a context manager")
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, oldest first (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        """The JSON bodies of the `POST /v1/chat/completions` requests, oldest first."""
        return [r.json for r in self.requests if r.method == "POST" and urlsplit(r.path).path == CHAT_PATH]

    @property
    def peak_in_flight(self) -> int:
        """The largest number of chat completion requests handled at the same moment."""
        with self._lock:
            return self._peak_in_flight

    @property
    def files(self) -> dict[str, StoredFile]:
        """Uploaded files by id (a copy)."""
        with self._lock:
            return dict(self._files)

    @property
    def jobs(self) -> dict[str, dict[str, Any]]:
        """Fine-tuning jobs by id, as the JSON the API returns (a deep copy)."""
        with self._lock:
            return copy.deepcopy(self._jobs)

    # -- fault injection -----------------------------------------------------

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

    def fail_fine_tuning_create(
        self, status: int = 403, message: str = "You are not allowed to fine-tune this model."
    ) -> None:
        """Refuse the next `POST /v1/fine_tuning/jobs` with `status` and `message`."""
        with self._lock:
            self._ft_create_refusal = (status, message)

    def _queue(self, fault: _Fault, n: int) -> None:
        with self._lock:
            self._faults.extend([fault] * n)

    # -- request handling (called from handler threads) -----------------------

    def _handle(self, request: RecordedRequest) -> _Response | None:
        """Answer one request; None means drop the connection without answering (server stopping)."""
        with self._lock:
            self._requests.append(request)
        method, path = request.method, urlsplit(request.path).path
        for route_method, pattern, handler in self._routes():
            match = re.fullmatch(pattern, path)
            if match and route_method == method:
                return handler(request, *match.groups())
        return _error(404, f"Unknown route: {method} {path}")

    def _routes(self) -> list[tuple[str, str, Callable[..., _Response | None]]]:
        return [
            ("POST", CHAT_PATH, self._chat),
            ("POST", r"/v1/files", self._upload_file),
            ("GET", r"/v1/files", self._list_files),
            ("GET", r"/v1/files/([^/]+)", self._get_file),
            ("GET", r"/v1/files/([^/]+)/content", self._get_file_content),
            ("POST", r"/v1/fine_tuning/jobs", self._create_job),
            ("GET", r"/v1/fine_tuning/jobs", self._list_jobs),
            ("GET", r"/v1/fine_tuning/jobs/([^/]+)", self._get_job),
            ("GET", r"/v1/fine_tuning/jobs/([^/]+)/events", self._list_job_events),
            ("POST", r"/v1/fine_tuning/jobs/([^/]+)/cancel", self._cancel_job),
        ]

    def _sleep(self, seconds: float) -> bool:
        """Sleep unless the server stops first; returns False when it stopped."""
        return seconds <= 0 or not self._stopping.wait(seconds)

    # chat completions

    @property
    def rate_limited(self) -> int:
        """Chat requests refused with a 429 by `rate_limit_rps`."""
        with self._lock:
            return self._rate_limited

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

    def _chat(self, request: RecordedRequest) -> _Response | None:
        wait = self._take_token()
        if wait is not None:
            response = _error(429, "Rate limit reached for requests (fake server).", code="rate_limit_exceeded")
            response.headers["Retry-After"] = f"{wait:.3f}"
            return response
        with self._lock:
            self._in_flight += 1
            self._peak_in_flight = max(self._peak_in_flight, self._in_flight)
            fault = self._faults.popleft() if self._faults else None
        try:
            if not self._sleep(self.latency):
                return None
            return self._answer_chat(request.json, fault)
        finally:
            with self._lock:
                self._in_flight -= 1

    def _answer_chat(self, body: Any, fault: _Fault | None) -> _Response | None:
        if fault is not None and fault.kind == "fail":
            return self._fault_response(fault)
        if fault is not None and fault.kind == "malformed":
            return _Response(200, b'{"id": "chatcmpl-broken", "choices": [{"index": 0, "message": ')
        if fault is not None and fault.kind == "hang" and not self._sleep(fault.seconds):
            return None
        if not isinstance(body, dict):
            return _error(400, "The request body must be a JSON object.")
        if self.reject_response_format and "response_format" in body:
            return _error(400, "response_format is not supported by this model.", param="response_format")
        if body.get("stream"):
            return _error(400, "FakeOpenAIServer does not support stream=True.", param="stream")
        n = body.get("n") or 1
        if not isinstance(n, int) or n < 1:
            return _error(400, f"Invalid n: {n!r}", param="n")
        reply = self._make_reply(body, n)
        if reply.status != 200:
            texts = [reply.texts] if isinstance(reply.texts, str) else reply.texts
            return _error(reply.status, " ".join(texts))
        return _json_response(self._completion(body, reply, n))

    def _fault_response(self, fault: _Fault) -> _Response:
        if fault.body is None:
            response = _error(fault.status, f"Injected error (status {fault.status}).")
        elif isinstance(fault.body, (dict, list)):
            response = _json_response(fault.body, fault.status)
        else:
            raw = fault.body if isinstance(fault.body, bytes) else str(fault.body).encode()
            response = _Response(fault.status, raw, content_type="text/plain")
        if fault.retry_after is not None:
            response.headers["Retry-After"] = f"{fault.retry_after:g}"
        if fault.retry_after_ms is not None:
            response.headers["retry-after-ms"] = str(fault.retry_after_ms)
        return response

    def _make_reply(self, body: dict[str, Any], n: int) -> FakeReply:
        """Resolve `self.reply` into a FakeReply with exactly `n` texts."""
        spec = self.reply
        if spec is None:
            users = [m for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "user"]
            result: ReplyResult = "echo: " + (_text_of(users[-1].get("content")) if users else "")
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
            raise ValueError(f"the reply gave {len(texts)} texts but the request asked for n={n}")
        return FakeReply(texts, reply.finish_reason, reply.status, reply.prompt_tokens, reply.completion_tokens)

    def _completion(self, body: dict[str, Any], reply: FakeReply, n: int) -> dict[str, Any]:
        prompt = " ".join(_text_of(m.get("content")) for m in body.get("messages") or [] if isinstance(m, dict))
        prompt_tokens = reply.prompt_tokens if reply.prompt_tokens is not None else _estimate_tokens(prompt)
        completion_tokens = reply.completion_tokens
        if completion_tokens is None:
            completion_tokens = sum(_estimate_tokens(text) for text in reply.texts)
        return {
            "id": _new_id("chatcmpl"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "system_fingerprint": "fp_fake",
            "choices": [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": None,
                    "finish_reason": reply.finish_reason,
                }
                for i, text in enumerate(reply.texts)
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    # files

    def _upload_file(self, request: RecordedRequest) -> _Response:
        content_type = request.headers.get("content-type", "")
        if not content_type.startswith("multipart/form-data"):
            return _error(400, "Uploads must be multipart/form-data.")
        fields = _parse_multipart(request.body, content_type)
        if "file" not in fields or "purpose" not in fields:
            return _error(400, "Both 'file' and 'purpose' fields are required.", param="file")
        filename, content = fields["file"]
        stored = StoredFile(
            id=_new_id("file"),
            filename=filename or "upload",
            purpose=fields["purpose"][1].decode(),
            content=content,
            created_at=int(time.time()),
        )
        with self._lock:
            self._files[stored.id] = stored
        return _json_response(stored.to_json())

    def _list_files(self, request: RecordedRequest) -> _Response:
        with self._lock:
            data = [f.to_json() for f in self._files.values()]
        return _json_response({"object": "list", "data": data, "has_more": False})

    def _get_file(self, request: RecordedRequest, file_id: str) -> _Response:
        with self._lock:
            stored = self._files.get(file_id)
        if stored is None:
            return _error(404, f"No such File object: {file_id}", param="id")
        return _json_response(stored.to_json())

    def _get_file_content(self, request: RecordedRequest, file_id: str) -> _Response:
        with self._lock:
            stored = self._files.get(file_id)
        if stored is None:
            return _error(404, f"No such File object: {file_id}", param="id")
        return _Response(200, stored.content, content_type="application/octet-stream")

    # fine-tuning jobs

    def _create_job(self, request: RecordedRequest) -> _Response:
        body = request.json if isinstance(request.json, dict) else {}
        with self._lock:
            refusal, self._ft_create_refusal = self._ft_create_refusal, None
            training = self._files.get(str(body.get("training_file")))
            validation_file = body.get("validation_file")
            validation_ok = validation_file is None or validation_file in self._files
        if refusal is not None:
            return _error(refusal[0], refusal[1])
        if not body.get("model"):
            return _error(400, "Missing required parameter: 'model'.", param="model")
        if training is None:
            return _error(400, f"Invalid file ID: {body.get('training_file')!r}", param="training_file")
        if not validation_ok:
            return _error(400, f"Invalid file ID: {validation_file!r}", param="validation_file")

        script = list(self.job_script) or ["validating_files"]
        hyperparameters = {"n_epochs": "auto", "batch_size": "auto", "learning_rate_multiplier": "auto"}
        hyperparameters.update(body.get("hyperparameters") or {})
        job_id = _new_id("ftjob")
        job: dict[str, Any] = {
            "object": "fine_tuning.job",
            "id": job_id,
            "model": body["model"],
            "created_at": int(time.time()),
            "finished_at": None,
            "fine_tuned_model": None,
            "organization_id": "org-fake",
            "result_files": [],
            "status": script[0],
            "validation_file": validation_file,
            "training_file": training.id,
            "hyperparameters": hyperparameters,
            "method": body.get("method") or {"type": "supervised", "supervised": {"hyperparameters": hyperparameters}},
            "trained_tokens": None,
            "error": None,
            "seed": body.get("seed") if body.get("seed") is not None else 42,
            "suffix": body.get("suffix"),
            "estimated_finish": None,
            "integrations": [],
            "metadata": body.get("metadata"),
        }
        with self._lock:
            self._jobs[job_id] = job
            self._job_progress[job_id] = (script, 0)
            self._job_events[job_id] = []
            self._job_training_tokens[job_id] = _estimate_tokens(training.content.decode(errors="replace"))
            self._add_event(job_id, f"Created fine-tuning job: {job_id}")
            self._enter_status(job_id, script[0])
            return _json_response(copy.deepcopy(job))

    def _list_jobs(self, request: RecordedRequest) -> _Response:
        with self._lock:
            data = copy.deepcopy(list(reversed(self._jobs.values())))  # newest first, like the API
        return _json_response({"object": "list", "data": data, "has_more": False})

    def _get_job(self, request: RecordedRequest, job_id: str) -> _Response:
        with self._lock:
            if job_id not in self._jobs:
                return _error(404, f"Fine-tuning job {job_id} not found.", param="fine_tuning_job_id")
            script, step = self._job_progress[job_id]
            if self._jobs[job_id]["status"] not in _TERMINAL_JOB_STATUSES and step + 1 < len(script):
                self._job_progress[job_id] = (script, step + 1)
                self._enter_status(job_id, script[step + 1])
            return _json_response(copy.deepcopy(self._jobs[job_id]))

    def _list_job_events(self, request: RecordedRequest, job_id: str) -> _Response:
        with self._lock:
            if job_id not in self._jobs:
                return _error(404, f"Fine-tuning job {job_id} not found.", param="fine_tuning_job_id")
            data = copy.deepcopy(list(reversed(self._job_events[job_id])))  # newest first, like the API
        return _json_response({"object": "list", "data": data, "has_more": False})

    def _cancel_job(self, request: RecordedRequest, job_id: str) -> _Response:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return _error(404, f"Fine-tuning job {job_id} not found.", param="fine_tuning_job_id")
            if job["status"] in _TERMINAL_JOB_STATUSES:
                return _error(400, f"Job has already {job['status']}; it cannot be cancelled.")
            self._enter_status(job_id, "cancelled")
            return _json_response(copy.deepcopy(job))

    def _enter_status(self, job_id: str, status: str) -> None:
        """Move a job to `status`, filling the fields that status implies. Caller holds the lock."""
        job = self._jobs[job_id]
        job["status"] = status
        self._add_event(job_id, f"Job status changed to {status}")
        if status in _TERMINAL_JOB_STATUSES:
            job["finished_at"] = int(time.time())
        if status == "succeeded":
            short_id = job_id.split("-", 1)[1][:8]
            job["fine_tuned_model"] = f"ft:{job['model']}:{job['suffix'] or 'opto'}:{short_id}"
            job["trained_tokens"] = self._job_training_tokens[job_id]
        elif status == "failed":
            job["error"] = dict(self.job_failure_error)
            self._add_event(job_id, str(job["error"].get("message", "The job failed.")), level="error")

    def _add_event(self, job_id: str, message: str, level: str = "info") -> None:
        """Record a job event. Caller holds the lock."""
        self._job_events[job_id].append(
            {
                "object": "fine_tuning.job.event",
                "id": _new_id("ftevent"),
                "created_at": int(time.time()),
                "level": level,
                "message": message,
                "type": "message",
                "data": None,
            }
        )

    def _track_connection(self, conn: socket.socket, open_: bool) -> None:
        with self._lock:
            if open_:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # Do not join handler threads on close: a hanging handler must not delay `stop()`.
    block_on_close = False
    # The default listen backlog (5) drops connections when many clients connect at once,
    # and a dropped SYN is only retried a second later.
    request_queue_size = 128
    fake: FakeOpenAIServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients dropping connections (timeouts, stop()) are expected here; report anything else.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    """HTTP plumbing only: read the request, pass it to the FakeOpenAIServer, write the answer."""

    # HTTP/1.1 keeps connections alive, as the OpenAI SDK's connection pool expects.
    protocol_version = "HTTP/1.1"
    # The headers and the body go out in two writes; with Nagle's algorithm on, the body
    # waits for the ACK of the headers, which the client delays by ~40 ms on a kept-alive
    # connection. TCP_NODELAY sends it at once.
    disable_nagle_algorithm = True
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.fake._track_connection(self.connection, True)

    def finish(self) -> None:
        self.server.fake._track_connection(self.connection, False)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default per-request logging to stderr."""

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    # Skip optional trailers up to the blank line.
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _dispatch(self) -> None:
        fake = self.server.fake
        try:
            body = self._read_body()
            try:
                parsed = json.loads(body) if body else None
            except ValueError:
                parsed = None
            headers = {key.lower(): value for key, value in self.headers.items()}
            request = RecordedRequest(self.command, self.path, headers, parsed, body)
            try:
                response = fake._handle(request)
            except Exception as exc:  # a bug in a reply callable should reach the test as a 500
                response = _error(500, f"FakeOpenAIServer handler error: {type(exc).__name__}: {exc}")
            if response is None:
                self.close_connection = True
                return
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            for name, value in response.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(response.body)
        except OSError:  # the client went away (or stop() closed the socket)
            self.close_connection = True
