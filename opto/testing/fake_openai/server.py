"""`FakeOpenAIServer`: the fake's lifecycle, request log and routing."""

from __future__ import annotations

import re
import socket
import threading
from typing import Callable
from urllib.parse import urlsplit

from .chat import CHAT_PATH, ChatAPI, ReplySpec
from .fine_tuning import FineTuningAPI
from .http import Handler, HTTPServer, RecordedRequest, Response, error
from .latency import LognormalLatency

__all__ = ["FakeOpenAIServer"]


class FakeOpenAIServer(ChatAPI, FineTuningAPI):
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
        latency: seconds each chat request waits before answering, or a
            `LognormalLatency` to draw each request's wait from (settable later;
            `chat_latencies` lists what was drawn).
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
        latency: float | LognormalLatency = 0.0,
        model: str = "fake-model",
        port: int = 0,
        rate_limit_rps: float | None = None,
    ) -> None:
        self._init_chat(reply, latency, model, rate_limit_rps)
        self._init_fine_tuning()
        self._port = port
        # One lock guards all mutable state; it is never held while sleeping or calling `reply`.
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._requests: list[RecordedRequest] = []
        self._connections: set[socket.socket] = set()
        self._httpd: HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> FakeOpenAIServer:
        """Start serving in a daemon thread; returns self."""
        if self._httpd is not None:
            raise RuntimeError("FakeOpenAIServer is already started")
        self._stopping.clear()
        self._httpd = HTTPServer(("127.0.0.1", self._port), Handler)
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

    def _handle(self, request: RecordedRequest) -> Response | None:
        """Answer one request; None means drop the connection without answering (server stopping)."""
        with self._lock:
            self._requests.append(request)
        method, path = request.method, urlsplit(request.path).path
        for route_method, pattern, handler in self._routes():
            match = re.fullmatch(pattern, path)
            if match and route_method == method:
                return handler(request, *match.groups())
        return error(404, f"Unknown route: {method} {path}")

    def _routes(self) -> list[tuple[str, str, Callable[..., Response | None]]]:
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

    def _track_connection(self, conn: socket.socket, open_: bool) -> None:
        with self._lock:
            if open_:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

