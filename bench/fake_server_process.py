"""A `FakeOpenAIServer` in a child process, driven through a pipe, for the benchmarks.

Measured in the client's process, the server's handler threads would share the GIL
with the client and their CPU would be counted against it; a real server runs elsewhere.
"""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Iterator
from typing import Any

from opto.testing import FakeOpenAIServer


def _serve(conn: Any, reply: Any) -> None:
    """Child process: serve, and answer (command, value) messages until "stop"."""
    with FakeOpenAIServer(reply) as server:
        conn.send(server.base_url)
        while True:
            command, value = conn.recv()
            if command == "latency":
                server.latency = value
                server.reset_peak_in_flight()
                conn.send(None)
            elif command == "stats":
                conn.send((server.peak_in_flight, len(server.chat_requests)))
            elif command == "latencies":
                conn.send(server.chat_latencies)
            else:
                conn.send(None)
                return


class ServerHandle:
    """The parent's side: `base_url`, `set_latency`, `stats`, `latencies`."""

    def __init__(self, server: FakeOpenAIServer | None = None, conn: Any = None) -> None:
        self._server, self._conn = server, conn
        self.base_url = server.base_url if server is not None else conn.recv()

    def _ask(self, command: str, value: Any = None) -> Any:
        self._conn.send((command, value))
        return self._conn.recv()

    def set_latency(self, latency: Any) -> None:
        """A fixed latency in seconds or a `LognormalLatency`; the peak in flight restarts."""
        if self._server is None:
            self._ask("latency", latency)
        else:
            self._server.latency = latency
            self._server.reset_peak_in_flight()

    def stats(self) -> tuple[int, int]:
        """(peak chat requests in flight since the latency was set, chat requests received)."""
        if self._server is None:
            return tuple(self._ask("stats"))  # type: ignore[return-value]
        return self._server.peak_in_flight, len(self._server.chat_requests)

    def latencies(self) -> list[tuple[Any, float]]:
        """(request body, latency drawn) of every chat request so far."""
        return self._ask("latencies") if self._server is None else self._server.chat_latencies


@contextlib.contextmanager
def fake_server(separate_process: bool = True, reply: Any = None) -> Iterator[ServerHandle]:
    """A fresh fake server, in a child process unless `separate_process` is False.
    `reply` must be picklable (a module-level function) for the child process."""
    if not separate_process:
        with FakeOpenAIServer(reply) as server:
            yield ServerHandle(server=server)
        return
    parent, child = multiprocessing.Pipe()
    process = multiprocessing.Process(target=_serve, args=(child, reply), daemon=True)
    process.start()
    try:
        handle = ServerHandle(conn=parent)
        yield handle
        handle._ask("stop")
    finally:
        process.join(timeout=5)
        if process.is_alive():
            process.terminate()
