"""`RoutedServer`: the lifecycle, request log and routing the fake servers share."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

from typing_extensions import Self

from ...errors import UsageError
from .http import Handler, HTTPServer, RecordedRequest, Response, error

__all__ = ["RoutedServer"]


class RoutedServer:
    """A fake HTTP API on 127.0.0.1: its lifecycle, request log and routing.

    Subclasses call `_init_server(port)` and list their routes in `_routes()` as
    (method, path regex, handler(request, *groups)).
    """

    _name = "fake server"

    def _init_server(self, port: int) -> None:
        self._port = port
        # One lock guards all mutable state; it is never held while sleeping or calling user code.
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._requests: list[RecordedRequest] = []
        self._connections: set[socket.socket] = set()
        self._httpd: HTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def root_url(self) -> str:
        """The server's root, e.g. "http://127.0.0.1:54321"."""
        if self._httpd is None:
            raise UsageError(f"{type(self).__name__} is not running; call start() or use it as a context manager")
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> Self:
        """Start serving in a daemon thread; returns self."""
        if self._httpd is not None:
            raise UsageError(f"{type(self).__name__} is already started")
        self._stopping.clear()
        self._httpd = HTTPServer(("127.0.0.1", self._port), Handler)
        self._httpd.fake = self
        # A short poll interval keeps `stop()` (which waits for the serve loop) fast.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name=type(self).__name__, daemon=True
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

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

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
        raise NotImplementedError

    def _sleep(self, seconds: float) -> bool:
        """Sleep unless the server stops first; returns False when it stopped."""
        return seconds <= 0 or not self._stopping.wait(seconds)

    def _track_connection(self, conn: socket.socket, open_: bool) -> None:
        with self._lock:
            if open_:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)
