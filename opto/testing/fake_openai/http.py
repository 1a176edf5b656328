"""The HTTP layer of the fake servers: requests, responses and the threaded server.

Nothing here knows the OpenAI API: a server object passes each `RecordedRequest` to its
`_handle` method and gets a `Response` (or None to drop the connection) back.
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ...errors import OptoValueError

__all__ = [
    "HTTPServer",
    "Handler",
    "RecordedRequest",
    "Response",
    "error",
    "estimate_tokens",
    "json_response",
    "new_id",
    "parse_multipart",
]

# Error `type`/`code` OpenAI uses for the common statuses, so clients that branch on them behave.
_ERROR_KINDS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "permission_denied"),
    404: ("invalid_request_error", "not_found"),
    429: ("requests", "rate_limit_exceeded"),
}


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


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    # A streamed answer: each chunk is sent as it is produced (chunked transfer encoding).
    chunks: Iterator[bytes] | None = None


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(status, json.dumps(payload).encode())


def error(status: int, message: str, *, code: str | None = None, param: str | None = None) -> Response:
    """An error response in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""
    default_type, default_code = _ERROR_KINDS.get(status, ("server_error", None))
    error = {"message": message, "type": default_type, "param": param, "code": code or default_code}
    return json_response({"error": error}, status)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def estimate_tokens(text: str) -> int:
    """A rough token count (about four characters per token, like OpenAI's rule of thumb)."""
    return (len(text) + 3) // 4


def parse_multipart(body: bytes, content_type: str) -> dict[str, tuple[str | None, bytes]]:
    """Parse a multipart/form-data body into {field name: (filename, content)}."""
    header = email.parser.Parser(policy=email.policy.HTTP).parsestr(f"Content-Type: {content_type}\r\n\r\n")
    boundary = header.get_param("boundary")
    if not isinstance(boundary, str):
        raise OptoValueError("multipart body without a boundary")
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


class HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # Do not join handler threads on close: a hanging handler must not delay `stop()`.
    block_on_close = False
    # The default listen backlog (5) drops connections when many clients connect at once,
    # and a dropped SYN is only retried a second later.
    request_queue_size = 128
    fake: Any  # the server object: it has _handle(request) and _track_connection(conn, open_)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients dropping connections (timeouts, stop()) are expected here; report anything else.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class Handler(BaseHTTPRequestHandler):
    """HTTP plumbing only: read the request, pass it to the fake server, write the answer."""

    # HTTP/1.1 keeps connections alive, as the OpenAI SDK's connection pool expects.
    protocol_version = "HTTP/1.1"
    # The headers and the body go out in two writes; with Nagle's algorithm on, the body
    # waits for the ACK of the headers, which the client delays by ~40 ms on a kept-alive
    # connection. TCP_NODELAY sends it at once.
    disable_nagle_algorithm = True
    server: HTTPServer

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

    def _stream(self, response: Response) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunks = response.chunks or iter(())
        try:
            for chunk in chunks:
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        finally:  # a client gone mid-stream: the producer learns it now (GeneratorExit), not at gc
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
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
                response = error(500, f"fake server handler error: {type(exc).__name__}: {exc}")
            if response is None:
                self.close_connection = True
                return
            if response.chunks is not None:
                self._stream(response)
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
