"""`FakeOpenAIServer`: the OpenAI routes on the shared fake-server lifecycle."""

from __future__ import annotations

from collections.abc import Callable

from .chat import CHAT_PATH, ChatAPI, ReplySpec
from .fine_tuning import FineTuningAPI
from .http import Response
from .latency import LognormalLatency
from .routed import RoutedServer

__all__ = ["FakeOpenAIServer"]


class FakeOpenAIServer(RoutedServer, ChatAPI, FineTuningAPI):
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
        self._init_server(port)

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, e.g. "http://127.0.0.1:54321/v1"."""
        return f"{self.root_url}/v1"

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
