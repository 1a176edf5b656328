"""A server that cannot be reached, or a base URL that points at the wrong route, fails
fast and says where: the URL opto tried and the setting that chooses it.

Real sockets on 127.0.0.1 only (a closed port, FakeOpenAIServer); the one other address
is `no-such-host.invalid`, a name that never resolves (RFC 2606), so its lookup fails
without any traffic. The retry delays are the real ones: how soon a call gives up is the
behaviour under test.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import openai
import pytest

from opto import ConnectionFailedError as TopLevelConnectionFailedError
from opto.llm import (
    ConnectionFailedError,
    EndpointNotFoundError,
    LLMRequestError,
    LLMUnavailableError,
    ModelNotFoundError,
    OpenAIModel,
)
from opto.llm.remote import connect_failure, public_url
from opto.llm.retry import CONNECT_RETRIES
from opto.testing import FakeOpenAIServer

pytestmark = pytest.mark.timeout(60)

MSG = [{"role": "user", "content": "How many legs does a spider have?"}]
KEY = "sk-test-0123456789abcdefSECRET"


@pytest.fixture
def make_model() -> Iterator[Callable[..., OpenAIModel]]:
    """OpenAIModels with a test key, each closed after the test."""
    models: list[OpenAIModel] = []

    def make(base_url: str, name: str = "gpt-4o-mini", **kwargs: Any) -> OpenAIModel:
        models.append(OpenAIModel(name, base_url=base_url, api_key=KEY, **kwargs))
        return models[-1]

    yield make
    for model in models:
        model.close()


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as srv:
        yield srv


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- could not connect ----------------------------------------------------------


async def test_a_closed_port_fails_within_seconds_naming_the_url_and_the_setting(make_model) -> None:
    base_url = f"http://127.0.0.1:{closed_port()}/v1"
    model = make_model(base_url)  # the default max_retries: the quick connect retries are not it

    started = time.monotonic()
    with pytest.raises(ConnectionFailedError) as info:
        await model.complete(MSG)
    elapsed = time.monotonic() - started

    error = info.value
    assert elapsed < 30  # a behavioural bound, not a benchmark: about 2 s of backoff in all
    assert isinstance(error, LLMUnavailableError) and isinstance(error, ConnectionError)
    assert error.attempts == CONNECT_RETRIES + 1
    message = str(error)
    assert f"{base_url}/chat/completions" in message
    assert "connection refused" in message
    assert "base_url" in message and "OPENAI_BASE_URL" in message and "--base-url" in message
    assert KEY not in message
    assert model.usage.calls == 0


async def test_an_unknown_host_fails_the_same_way(make_model) -> None:
    model = make_model("http://no-such-host.invalid/v1")

    started = time.monotonic()
    with pytest.raises(ConnectionFailedError) as info:
        await model.complete(MSG)

    assert time.monotonic() - started < 30
    message = str(info.value)
    assert "http://no-such-host.invalid/v1/chat/completions" in message
    assert "unknown host" in message and "base_url" in message


async def test_max_retries_still_bounds_the_connect_retries(make_model) -> None:
    model = make_model(f"http://127.0.0.1:{closed_port()}/v1", max_retries=0)

    with pytest.raises(ConnectionFailedError) as info:
        await model.complete(MSG)

    assert info.value.attempts == 1


async def test_concurrent_calls_to_a_dead_server_warn_once(make_model, caplog) -> None:
    model = make_model(f"http://127.0.0.1:{closed_port()}/v1")

    with caplog.at_level(logging.DEBUG, logger="opto.llm.remote"):
        results = await asyncio.gather(*(model.complete(MSG) for _ in range(8)), return_exceptions=True)

    assert all(isinstance(r, ConnectionFailedError) for r in results)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1  # the other retries of the outage are at DEBUG
    assert "could not connect to http://127.0.0.1:" in warnings[0].getMessage()
    assert [r for r in caplog.records if r.levelno == logging.DEBUG]  # still there for whoever asks


async def test_the_error_is_exported_at_the_top_level() -> None:
    assert TopLevelConnectionFailedError is ConnectionFailedError


def test_what_counts_as_a_failure_to_connect() -> None:
    def raised_from(cause: BaseException) -> BaseException:
        try:
            try:
                raise cause
            except BaseException:
                raise openai.APIConnectionError(message="Connection error", request=None) from None  # type: ignore[arg-type]
        except openai.APIConnectionError as exc:
            return exc

    assert connect_failure(raised_from(ConnectionRefusedError(111, "refused"))) == "connection refused"
    assert connect_failure(raised_from(socket.gaierror(-2, "Name or service not known"))) == "unknown host"
    assert connect_failure(raised_from(aiohttp.ClientSSLError(None, OSError("bad cert")))) == "TLS error"  # type: ignore[arg-type]
    # A connection that broke once made, and a timeout, keep the usual retries.
    assert connect_failure(raised_from(aiohttp.ServerDisconnectedError())) is None
    assert connect_failure(raised_from(ConnectionResetError(104, "reset"))) is None
    assert connect_failure(openai.APITimeoutError(request=None)) is None  # type: ignore[arg-type]
    assert connect_failure(openai.APIConnectionError(message="Connection error", request=None)) is None  # type: ignore[arg-type]


def test_urls_in_messages_carry_no_credentials() -> None:
    assert public_url("https://user:pass@example.com:8443/v1?api-key=abc#x") == "https://example.com:8443/v1"
    assert public_url("http://[::1]:8000/v1") == "http://[::1]:8000/v1"


# -- the wrong URL, or the wrong model -------------------------------------------


async def test_a_base_url_without_v1_is_a_missing_route_that_suggests_v1(server, make_model) -> None:
    model = make_model(server.root_url)  # FakeOpenAIServer serves /v1/chat/completions only

    with pytest.raises(EndpointNotFoundError) as info:
        await model.complete(MSG)

    error = info.value
    assert isinstance(error, LLMRequestError) and isinstance(error, ValueError)
    assert not isinstance(error, ModelNotFoundError)  # the model's name is not to blame
    assert error.status_code == 404
    message = str(error)
    assert f"POST {server.root_url}/chat/completions" in message
    assert f"Try {server.root_url}/v1 as the base URL" in message
    assert "base_url" in message
    assert len(server.requests) == 1  # refused, not retried


@pytest.mark.parametrize(
    "body",
    [
        {"detail": "Not Found"},  # FastAPI (vLLM) for a path it does not serve
        "404 page not found",  # Go's default (Ollama)
        {"error": {"message": "Invalid URL (POST /v1/chat/completions)", "type": "invalid_request_error"}},  # OpenAI
    ],
)
async def test_a_web_servers_own_404_is_a_missing_route(server, make_model, body) -> None:
    server.fail_next(1, status=404, body=body)
    model = make_model(server.base_url)

    with pytest.raises(EndpointNotFoundError) as info:
        await model.complete(MSG)

    message = str(info.value)
    assert f"{server.base_url}/chat/completions" in message
    assert "Try " not in message  # the base URL already ends in /v1: nothing to suggest


@pytest.mark.parametrize(
    "body",
    [
        {  # OpenAI
            "error": {
                "message": "The model `gpt-nope` does not exist or you do not have access to it.",
                "type": "invalid_request_error",
                "param": None,
                "code": "model_not_found",
            }
        },
        {"object": "error", "message": "The model `gpt-nope` does not exist.", "type": "NotFoundError", "code": 404},
        {"error": {"message": 'model "gpt-nope" not found, try pulling it first', "type": "api_error"}},  # Ollama
    ],
)
async def test_a_model_the_server_does_not_have_is_still_model_not_found(server, make_model, body) -> None:
    server.fail_next(1, status=404, body=body)
    model = make_model(server.base_url, name="gpt-nope")

    with pytest.raises(ModelNotFoundError) as info:
        await model.complete(MSG)

    error = info.value
    assert type(error) is ModelNotFoundError and error.status_code == 404
    assert "gpt-nope" in str(error) and f"{server.base_url}/chat/completions" in str(error)
    assert len(server.requests) == 1
