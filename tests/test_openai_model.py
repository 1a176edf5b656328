"""OpenAIModel (and LiteLLMModel, through LiteLLM's OpenAI-compatible route) against the
offline FakeOpenAIServer (a real HTTP server on 127.0.0.1).

Every test that takes `make_model` runs once per backend: the contract is the same.

Retries and Retry-After, the concurrency cap and rate limits as the server sees them,
response_format fallback, truncation, timeouts, broken replies, budget, cache, event
loops and API keys. Everything is offline and kept fast: short latencies, timeouts and
rate-limit windows, and a 10 ms backoff wherever the test is not about the delay itself.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import opto.llm.remote as remote_module
from opto.errors import OptoError
from opto.llm import (
    AuthenticationError,
    BadRequestError,
    ContextWindowExceededError,
    LLMTimeoutError,
    ModelNotFoundError,
    QuotaExceededError,
    RateLimitError,
    ServerError,
    Budget,
    BudgetExceeded,
    LLMRequestError,
    LiteLLMModel,
    LLMUnavailableError,
    OpenAIModel,
    ResponseCache,
    TokenUsage,
    ratelimit,
)
from opto.testing import FakeOpenAIServer, FakeReply

pytestmark = pytest.mark.timeout(30)

MSG = [{"role": "user", "content": "How many legs does a spider have?"}]
ECHO = "echo: How many legs does a spider have?"
KEY = "sk-test-0123456789abcdefSECRET"
JSON_MODE = {"type": "json_object"}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}}}


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as srv:
        yield srv


@pytest.fixture(params=["openai", "litellm"])
def make_model(request: pytest.FixtureRequest, server: FakeOpenAIServer) -> Iterator[Callable[..., OpenAIModel]]:
    """Models pointed at `server` with a test key, one backend per run of the test; all
    closed after the test (before the server stops)."""
    models: list[Any] = []

    def make(name: str = "gpt-test", **kwargs: Any) -> Any:
        kwargs.setdefault("timeout", 5.0)
        if request.param == "litellm":
            kwargs.setdefault("api_base", kwargs.pop("base_url", server.base_url))
            kwargs.setdefault("api_key", KEY)
            # LiteLLM's OpenAI route sends the name without its "openai/" prefix; the model
            # keeps the plain name so usage and prices are those of the name the server sees.
            model: Any = LiteLLMModel(name, custom_llm_provider="openai", **kwargs)
        else:
            kwargs.setdefault("base_url", server.base_url)
            kwargs.setdefault("api_key", KEY)
            model = OpenAIModel(name, **kwargs)
        models.append(model)
        return model

    yield make
    for model in models:
        model.close()


@pytest.fixture(autouse=True)
def backoff_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Exponential backoff takes 10 ms in these tests; returns the attempts it was asked for."""
    calls: list[int] = []

    def fast_backoff(attempt: int, *args: Any, **kwargs: Any) -> float:
        calls.append(attempt)
        return 0.01

    monkeypatch.setattr(remote_module, "backoff_delay", fast_backoff)
    return calls


def arrival_recorder(times: list[float], reply: Any = "ok") -> Callable[[dict[str, Any]], Any]:
    """A reply callable that notes when each request was answered (latency 0: when it arrived)."""

    def answer(body: dict[str, Any]) -> Any:
        times.append(time.monotonic())
        return reply

    return answer


# -- plain calls ----------------------------------------------------------------


async def test_completion_texts_usage_model_and_n(server, make_model) -> None:
    server.reply = lambda body: FakeReply(texts=["one", "two", "three"], prompt_tokens=11, completion_tokens=7)
    model = make_model()

    completion = await model.complete(MSG, n=3, temperature=0.7, max_tokens=50, seed=3)

    assert completion.texts == ["one", "two", "three"]
    assert completion.usage == TokenUsage(prompt_tokens=11, completion_tokens=7)  # the server's, not estimates
    assert completion.model == "gpt-test"
    assert completion.finish_reason == "stop" and not completion.truncated and not completion.cached
    assert server.chat_requests == [
        {"model": "gpt-test", "messages": MSG, "temperature": 0.7, "max_tokens": 50, "n": 3, "seed": 3}
    ]
    usage = model.usage
    assert (usage.calls, usage.prompt_tokens, usage.completion_tokens, usage.cached_calls) == (1, 11, 7, 0)


async def test_defaults_send_only_model_and_messages(server, make_model) -> None:
    completion = await make_model().complete(MSG)

    assert completion.texts == [ECHO]
    assert server.chat_requests == [{"model": "gpt-test", "messages": MSG}]


# -- retries ----------------------------------------------------------------------


@pytest.mark.parametrize("header", ["retry_after", "retry_after_ms"])
async def test_429_is_retried_after_the_delay_the_server_asks_for(server, make_model, backoff_calls, header, caplog):
    server.fail_next(1, status=429, **({"retry_after": 0.3} if header == "retry_after" else {"retry_after_ms": 300}))
    model = make_model(max_retries=2)

    start = time.monotonic()
    with caplog.at_level(logging.WARNING):
        completion = await model.complete(MSG)
    elapsed = time.monotonic() - start

    assert completion.text == ECHO
    assert len(server.chat_requests) == 2
    assert elapsed >= 0.3  # the Retry-After wait, not the 10 ms backoff
    assert backoff_calls == []
    assert "RateLimitError 429" in caplog.text
    assert KEY not in caplog.text


async def test_500_then_success(server, make_model, backoff_calls) -> None:
    server.fail_next(1, status=500)
    completion = await make_model(max_retries=2).complete(MSG)

    assert completion.text == ECHO
    assert len(server.chat_requests) == 2
    assert backoff_calls == [0]


async def test_retries_exhausted_raise_unavailable_with_attempts(server, make_model, backoff_calls) -> None:
    server.fail_next(3, status=503)
    model = make_model(max_retries=2)

    with pytest.raises(ServerError, match="503") as info:
        await model.complete(MSG)

    assert info.value.attempts == 3 and info.value.status_code == 503
    assert len(server.chat_requests) == 3
    assert backoff_calls == [0, 1]  # exponential backoff between attempts, growing
    assert model.usage.calls == 0


@pytest.mark.parametrize(("status", "cause"), [(400, BadRequestError), (401, AuthenticationError),
                                               (403, AuthenticationError), (404, ModelNotFoundError),
                                               (422, BadRequestError)])
async def test_client_errors_are_not_retried(server, make_model, backoff_calls, status, cause) -> None:
    server.fail_next(1, status=status)

    with pytest.raises(LLMRequestError) as info:
        await make_model(max_retries=3).complete(MSG)

    assert type(info.value) is cause and isinstance(info.value, OptoError)
    assert info.value.status_code == status
    assert info.value.model.endswith("gpt-test") and info.value.request_id == "req_fake_1"
    assert len(server.chat_requests) == 1
    assert backoff_calls == []


async def test_400_about_something_else_keeps_response_format(server, make_model) -> None:
    # E.g. a prompt over the context length while JSON mode is on: not a reason to drop JSON mode.
    server.fail_next(
        1,
        status=400,
        body={
            "error": {
                "message": "This model's maximum context length is 8192 tokens.",
                "type": "invalid_request_error",
                "param": "messages",
            }
        },
    )
    model = make_model()

    with pytest.raises(ContextWindowExceededError, match="maximum context length") as info:
        await model.complete(MSG, response_format=JSON_MODE)
    assert isinstance(info.value, ValueError) and info.value.status_code == 400
    assert len(server.chat_requests) == 1

    await model.complete(MSG, response_format=JSON_MODE)
    assert server.chat_requests[-1]["response_format"] == JSON_MODE


async def test_timeout_is_retried(server, make_model) -> None:
    server.hang_next(1, seconds=5)
    model = make_model(timeout=0.3, max_retries=1)

    start = time.monotonic()
    completion = await model.complete(MSG)

    assert completion.text == ECHO
    assert time.monotonic() - start >= 0.3
    assert len(server.chat_requests) == 2


async def test_timeouts_on_every_attempt_raise_unavailable(server, make_model) -> None:
    server.hang_next(2, seconds=5)

    with pytest.raises(LLMTimeoutError, match="Timeout") as info:
        await make_model(timeout=0.3, max_retries=1).complete(MSG)

    assert info.value.attempts == 2 and isinstance(info.value, TimeoutError)
    assert len(server.chat_requests) == 2


async def test_malformed_body_then_success(server, make_model) -> None:
    server.malformed_next(1)
    completion = await make_model(max_retries=1).complete(MSG)

    assert completion.text == ECHO
    assert len(server.chat_requests) == 2


async def test_reply_without_choices_is_retried(server, make_model) -> None:
    empty = {"id": "chatcmpl-empty", "object": "chat.completion", "created": 0, "model": "gpt-test", "choices": []}
    server.fail_next(1, status=200, body=empty)
    completion = await make_model(max_retries=1).complete(MSG)

    assert completion.text == ECHO
    assert len(server.chat_requests) == 2


@pytest.mark.parametrize("choice", [1, {"message": "text, not an object"}], ids=["not an object", "message not an object"])
async def test_reply_with_a_broken_choice_is_retried_as_malformed(server, make_model, choice) -> None:
    broken = {"id": "chatcmpl-broken", "object": "chat.completion", "created": 0, "model": "gpt-test", "choices": [choice]}
    server.fail_next(2, status=200, body=broken)

    with pytest.raises(ServerError, match="gave up after 2 attempts") as info:
        await make_model(max_retries=1).complete(MSG)

    assert info.value.attempts == 2 and len(server.chat_requests) == 2


# -- concurrency and rate limits --------------------------------------------------------


async def test_concurrency_cap_as_seen_by_the_server(server, make_model) -> None:
    server.latency = 0.1
    model = make_model(max_concurrency=4)

    completions = await asyncio.gather(*(model.complete(MSG) for _ in range(20)))

    assert all(c.text == ECHO for c in completions)
    assert len(server.chat_requests) == 20
    assert server.peak_in_flight == 4


async def test_requests_per_minute_are_spread_evenly_not_sent_in_one_burst(server, make_model, monkeypatch) -> None:
    window = 0.6
    monkeypatch.setattr(ratelimit, "_WINDOW", window)  # before the model (and its limiter) is built
    arrivals: list[float] = []
    server.reply = arrival_recorder(arrivals)
    model = make_model(requests_per_minute=3)

    await asyncio.gather(*(model.complete(MSG) for _ in range(4)))

    arrivals.sort()
    assert len(arrivals) == 4
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert all(gap >= 0.8 * window / 3 for gap in gaps), gaps  # one every window/3, never a burst
    assert arrivals[3] - arrivals[0] >= 0.8 * window


async def test_tokens_per_minute_count_the_usage_the_server_reports(server, make_model, monkeypatch) -> None:
    window = 0.5
    monkeypatch.setattr(ratelimit, "_WINDOW", window)
    arrivals: list[float] = []
    # Each call is estimated at 8 prompt + 20 max_tokens = 28 tokens but really uses 50.
    server.reply = arrival_recorder(arrivals, FakeReply(texts="ok", prompt_tokens=20, completion_tokens=30))
    model = make_model(tokens_per_minute=100)

    for _ in range(3):
        await model.complete(MSG, max_tokens=20)

    # 50 + 28 fits, 100 + 28 does not: the third call waits for the first to leave the window.
    # (Counting the estimates only, 3 x 28 = 84 would have let it through at once.)
    assert len(arrivals) == 3
    assert arrivals[1] - arrivals[0] < window
    assert arrivals[2] - arrivals[0] >= 0.8 * window


# -- response_format fallback and truncation ------------------------------------------------


async def test_rejected_json_mode_falls_back_once_and_is_not_sent_again(server, make_model) -> None:
    server.reject_response_format = True
    model = make_model()

    completion = await model.complete(MSG, response_format=JSON_MODE)

    assert completion.text == ECHO
    first, second = server.chat_requests
    assert first["response_format"] == JSON_MODE
    assert "response_format" not in second

    await model.complete([{"role": "user", "content": "again"}], response_format=JSON_MODE)
    assert len(server.chat_requests) == 3
    assert "response_format" not in server.chat_requests[2]


async def test_rejected_json_schema_steps_down_to_json_mode_then_none(server, make_model) -> None:
    server.reject_response_format = True
    model = make_model()

    await model.complete(MSG, response_format=SCHEMA)

    sent = [body.get("response_format") for body in server.chat_requests]
    assert sent == [SCHEMA, JSON_MODE, None]


async def test_concurrent_calls_all_fall_back_when_json_mode_is_rejected(server, make_model) -> None:
    server.reject_response_format = True
    server.latency = 0.05
    model = make_model(max_concurrency=4)

    completions = await asyncio.gather(*(model.complete(MSG, response_format=JSON_MODE) for _ in range(4)))

    assert [c.text for c in completions] == [ECHO] * 4
    accepted = [body for body in server.chat_requests if "response_format" not in body]
    assert len(accepted) == 4


async def test_length_finish_reason_marks_the_completion_truncated(server, make_model) -> None:
    server.reply = lambda body: FakeReply(texts='{"answer": "eig', finish_reason="length")

    completion = await make_model().complete(MSG, max_tokens=5)

    assert completion.truncated is True
    assert completion.finish_reason == "length"
    assert completion.text == '{"answer": "eig'


# -- budget and cache ------------------------------------------------------------------------


async def test_shared_budget_refuses_the_third_call_before_sending_it(server, make_model) -> None:
    budget = Budget(max_calls=2)
    first, second = make_model("model-a", budget=budget), make_model("model-b", budget=budget)

    await first.complete(MSG)
    await second.complete(MSG)
    with pytest.raises(BudgetExceeded):
        await first.complete(MSG)

    assert len(server.chat_requests) == 2
    assert budget.remaining()["calls"] == 0


async def test_failed_call_does_not_use_the_budget(server, make_model) -> None:
    budget = Budget(max_calls=1)
    model = make_model(budget=budget, max_retries=0)
    server.fail_next(1, status=500)

    with pytest.raises(LLMUnavailableError):
        await model.complete(MSG)
    await model.complete(MSG)

    assert budget.calls == 1
    assert len(server.chat_requests) == 2


async def test_cache_hit_sends_nothing(server, make_model, tmp_path) -> None:
    model = make_model(cache=ResponseCache(tmp_path / "cache.sqlite"))

    fresh = await model.complete(MSG)
    again = await model.complete(MSG)

    assert len(server.chat_requests) == 1
    assert (fresh.cached, again.cached) == (False, True)
    assert again.texts == fresh.texts == [ECHO]
    assert again.usage == TokenUsage()
    assert (model.usage.calls, model.usage.cached_calls) == (1, 1)


async def test_cache_keeps_the_samples_of_a_request_apart(server, make_model, tmp_path) -> None:
    calls = []

    def reply(body: dict[str, Any]) -> list[str]:
        calls.append(body)
        return [f"call {len(calls)} sample {i}" for i in range(body.get("n", 1))]

    server.reply = reply
    model = make_model(cache=ResponseCache(tmp_path / "cache.sqlite"))

    two = await model.complete(MSG, temperature=1.0, n=2)
    assert two.texts == ["call 1 sample 0", "call 1 sample 1"]  # two distinct samples, both stored

    again = await model.complete(MSG, temperature=1.0, n=2)
    assert again.cached and again.texts == two.texts
    assert len(server.chat_requests) == 1

    assert len(model.cache) == 2  # one entry per sample

    # The key covers the whole request, n included: n=3 is another request, not 2 hits + 1.
    three = await model.complete(MSG, temperature=1.0, n=3)
    assert three.texts == ["call 2 sample 0", "call 2 sample 1", "call 2 sample 2"]
    assert not three.cached
    assert server.chat_requests[1]["n"] == 3


# -- event loops and close ----------------------------------------------------------------------


def _loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("opto-openai-")]


def test_model_works_across_asyncio_run_calls_and_after_close(server, make_model) -> None:
    model = make_model(max_concurrency=2)

    first = asyncio.run(model.complete(MSG))
    second = asyncio.run(model.complete([{"role": "user", "content": "second loop"}]))
    assert (first.text, second.text) == (ECHO, "echo: second loop")

    model.close()
    assert _loop_threads() == []
    model.close()  # twice is fine

    async def several() -> list[str]:
        return [c.text for c in await asyncio.gather(*(model.complete(MSG) for _ in range(4)))]

    assert asyncio.run(several()) == [ECHO] * 4  # a new private loop, client and semaphore
    assert server.peak_in_flight <= 2
    assert len(server.chat_requests) == 6


def test_aclose_then_reuse(server, make_model) -> None:
    model = make_model()

    async def call_then_close() -> str:
        text = (await model.complete(MSG)).text
        await model.aclose()
        return text

    assert asyncio.run(call_then_close()) == ECHO
    assert _loop_threads() == []
    assert asyncio.run(model.complete(MSG)).text == ECHO


# -- API key and construction ---------------------------------------------------------------------


def test_no_key_and_no_base_url_is_refused(monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)

    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        OpenAIModel("gpt-4o-mini")


async def test_key_is_sent_but_never_shown(server, make_model) -> None:
    model = make_model()

    await model.complete(MSG)

    assert server.requests[-1].headers["authorization"] == f"Bearer {KEY}"
    assert KEY not in repr(model) and KEY not in str(model)


async def test_requests_carry_the_sdk_headers_organization_and_project(server, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_ORG_ID", "org-test")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-test")
    model = OpenAIModel("gpt-test", base_url=server.base_url, api_key=KEY)
    try:
        await model.complete(MSG)
    finally:
        await model.aclose()

    headers = server.requests[-1].headers
    assert headers["openai-organization"] == "org-test" and headers["openai-project"] == "proj-test"
    assert headers["user-agent"].startswith("AsyncOpenAI/Python") and headers["content-type"] == "application/json"
    assert not [name for name in headers if name.lower().startswith("x-stainless-")]  # the SDK's telemetry stays home


def test_one_sdk_client_serves_every_loop_and_never_travels(server, posters) -> None:
    import pickle

    model = OpenAIModel("gpt-test", base_url=server.base_url, api_key=KEY)
    asyncio.run(model.complete(MSG))
    asyncio.run(model.complete(MSG))
    assert len(posters) == 2 and posters[0].client is posters[1].client  # made once: it costs an SSL context
    assert pickle.loads(pickle.dumps(model))._sdk is None
    model.close()


def test_the_proxy_comes_from_the_environment_and_no_proxy_is_honoured(monkeypatch) -> None:
    from opto.llm._chat_http import _env_proxy

    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert _env_proxy("https://api.openai.com/v1/chat/completions") == "http://proxy.example:3128"
    assert _env_proxy("http://127.0.0.1:8000/v1/chat/completions") is None  # no HTTP_PROXY set
    monkeypatch.setenv("NO_PROXY", "api.openai.com")
    assert _env_proxy("https://api.openai.com/v1/chat/completions") is None


async def test_a_refused_connection_is_retried_then_reported(backoff_calls) -> None:
    with FakeOpenAIServer() as gone:
        url = gone.base_url  # a port nobody listens on once the server stops
    model = OpenAIModel("gpt-test", base_url=url, api_key=KEY, max_retries=2)
    try:
        with pytest.raises(LLMUnavailableError, match="gave up after 3 attempts: .*Connection error"):
            await model.complete(MSG)
    finally:
        await model.aclose()
    assert len(backoff_calls) == 2


@pytest.fixture
def posters(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every ChatPoster made from now on (one per event loop that calls a model)."""
    made: list[Any] = []
    make = OpenAIModel._new_poster

    def recording(self: OpenAIModel) -> Any:
        made.append(make(self))
        return made[-1]

    monkeypatch.setattr(OpenAIModel, "_new_poster", recording)
    return made


def test_requests_run_on_the_callers_loop_and_each_loop_closes_its_connections(server, posters) -> None:
    model = OpenAIModel("gpt-test", base_url=server.base_url, api_key=KEY)

    assert asyncio.run(model.complete(MSG)).text == ECHO
    assert asyncio.run(model.complete(MSG)).text == ECHO

    assert _loop_threads() == []  # no private loop: the requests ran on asyncio.run's loops
    assert len(posters) == 2 and all(p._session is None for p in posters)  # closed as each loop ended
    assert len(model._posters) == 0
    model.close()


async def test_a_model_collected_while_its_loop_runs_closes_its_connections_there(server, posters, recwarn) -> None:
    import gc

    model = OpenAIModel("gpt-test", base_url=server.base_url, api_key=KEY)
    assert (await model.complete(MSG)).text == ECHO
    session = f"{id(posters[0]._session):x}"
    del model
    gc.collect()
    for _ in range(20):  # the loop closes the dropped client as it runs on
        await asyncio.sleep(0.01)
        if posters[0]._session is None:
            break
    assert posters[0]._session is None
    gc.collect()
    assert not [w for w in recwarn if "nclosed" in str(w.message) and session in str(w.message)]


def test_a_rate_limited_model_that_is_never_closed_closes_its_private_loop_when_collected(server, posters, recwarn) -> None:
    import gc

    model = OpenAIModel("gpt-test", base_url=server.base_url, api_key=KEY, requests_per_minute=600)
    assert asyncio.run(model.complete(MSG)).text == ECHO
    loop = model._loop
    assert loop.running and len(posters) == 1  # the limits live on the private loop
    session = f"{id(posters[0]._session):x}"  # other tests' leftovers (e.g. LiteLLM's) may warn too
    del model
    gc.collect()
    assert not loop.running
    assert posters[0]._session is None
    gc.collect()
    assert not [w for w in recwarn if "nclosed" in str(w.message) and session in str(w.message)]


def test_max_concurrency_holds_across_loops_in_several_threads() -> None:
    with FakeOpenAIServer(latency=0.05) as slow:
        model = OpenAIModel("gpt-test", base_url=slow.base_url, api_key=KEY, max_concurrency=3)

        async def burst() -> list[str]:
            return [c.text for c in await asyncio.gather(*(model.complete(MSG) for _ in range(8)))]

        results: list[list[str]] = []
        threads = [threading.Thread(target=lambda: results.append(asyncio.run(burst()))) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        model.close()
    assert results == [[ECHO] * 8] * 3
    assert slow.peak_in_flight == 3  # three loops, one cap


async def test_key_and_base_url_from_the_environment(server, monkeypatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    model = OpenAIModel("gpt-test")
    try:
        assert (await model.complete(MSG)).text == ECHO
    finally:
        await model.aclose()

    assert server.requests[-1].headers["authorization"] == "Bearer sk-from-env"
    assert "sk-from-env" not in repr(model)


async def test_local_server_needs_no_key(server, monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    model = OpenAIModel("local-model", base_url=server.base_url)
    try:
        assert (await model.complete(MSG)).text == ECHO
    finally:
        await model.aclose()
    assert server.chat_requests[-1]["model"] == "local-model"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"max_retries": -1}, "max_retries"),
        ({"timeout": 0}, "timeout"),
        ({"requests_per_minute": 0}, "requests_per_minute"),
        ({"tokens_per_minute": 0}, "tokens_per_minute"),
    ],
)
def test_bad_settings_are_refused(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        OpenAIModel("gpt-test", api_key=KEY, base_url="http://127.0.0.1:9/v1", **kwargs)


def test_request_timeout_and_conflict_statuses_are_retried():
    with FakeOpenAIServer(reply="fine") as server:
        server.fail_next(1, status=408)
        server.fail_next(1, status=409)
        model = OpenAIModel("m", base_url=server.base_url, api_key="k", max_retries=2)
        try:
            reply = asyncio.run(model.complete([{"role": "user", "content": "hi"}]))
        finally:
            model.close()
    assert reply.text == "fine"
    assert len(server.chat_requests) == 3


# -- rate limits that lose nothing, and keys that never leak ------------------------


async def test_a_rate_limited_server_loses_no_request() -> None:
    with FakeOpenAIServer(rate_limit_rps=20) as limited:
        model = OpenAIModel("gpt-test", base_url=limited.base_url, api_key=KEY, max_retries=1,
                            rate_limit_patience=30)
        try:
            completions = await asyncio.gather(*(model.complete(MSG) for _ in range(40)))
        finally:
            await model.aclose()
        assert [c.text for c in completions] == [ECHO] * 40
        assert limited.rate_limited > 0  # refusals happened, and each was retried past max_retries=1


async def test_with_no_patience_429s_count_against_max_retries(server, make_model, backoff_calls) -> None:
    server.fail_next(3, status=429, retry_after=0.01)
    with pytest.raises(RateLimitError, match="gave up after 3 attempts") as info:
        await make_model(max_retries=2, rate_limit_patience=0).complete(MSG)
    assert info.value.status_code == 429 and info.value.retry_after == pytest.approx(0.01)


def test_retry_after_gets_jitter_on_top() -> None:
    import random

    from opto.llm.retry import retry_after_delay

    rng = random.Random(0)
    delays = [retry_after_delay(1.0, attempt=0, rng=rng) for _ in range(200)]
    assert all(1.0 <= d <= 1.5 for d in delays)
    assert max(delays) - min(delays) > 0.3  # spread, not all at the same instant


def test_the_fake_server_enforces_its_rate_limit() -> None:
    import httpx2

    with FakeOpenAIServer(rate_limit_rps=2) as limited:
        url = limited.base_url + "/chat/completions"
        statuses = [httpx2.post(url, json={"model": "m", "messages": MSG}).status_code for _ in range(4)]
        assert statuses[:2] == [200, 200] and 429 in statuses[2:]
        refused = httpx2.post(url, json={"model": "m", "messages": MSG})
        if refused.status_code == 429:
            assert 0 < float(refused.headers["Retry-After"]) <= 0.5
        assert limited.rate_limited >= 1


@pytest.mark.parametrize("status", [401, 400, 500])
async def test_a_key_echoed_in_an_error_is_redacted_everywhere(server, make_model, backoff_calls, caplog,
                                                               status) -> None:
    echo = {"error": {"message": f"Invalid API key provided: Bearer {KEY}. Check it.", "type": "auth"}}
    server.fail_next(3, status=status, body=echo)
    caplog.set_level(logging.DEBUG)
    with pytest.raises((LLMRequestError, LLMUnavailableError)) as caught:
        await make_model(max_retries=1).complete(MSG)
    assert KEY not in str(caught.value) and "[REDACTED]" in str(caught.value)
    assert caught.value.__cause__ is None  # the raw error, which holds the key, is not chained
    assert KEY not in caplog.text


def test_the_no_key_placeholder_is_not_treated_as_a_secret(server, monkeypatch) -> None:
    from opto.llm.openai_model import NO_KEY
    from opto._util.redaction import redact

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    model = OpenAIModel("gpt-test", base_url=server.base_url)
    model.close()
    assert redact(f"sent {NO_KEY} to a local server") == f"sent {NO_KEY} to a local server"


def test_a_training_run_never_writes_the_key(tmp_path, caplog) -> None:
    import json as json_module

    from opto import AggregatedUpdate, ExactMatchGuide, Optimizer, Parameter, agent

    echo = {"error": {"message": f"Proxy error for Authorization: Bearer {KEY}"}}

    def reply(request):
        return FakeReply(f"upstream rejected Bearer {KEY}", status=500)

    @agent(params={"prompt": Parameter("Answer.")})
    def qa(x, prompt):
        return "4"

    caplog.set_level(logging.DEBUG)
    with FakeOpenAIServer(reply=reply) as failing:
        failing.fail_next(1, status=401, body=echo)
        model = OpenAIModel("gpt-test", base_url=failing.base_url, api_key=KEY, max_retries=1)
        try:
            AggregatedUpdate(qa, Optimizer(model), proposals="per_instance", validation="minibatch").train(ExactMatchGuide(), [("2+2", "5"), ("1+1", "3")],
                                                         run_dir=tmp_path, progress=False)
        finally:
            model.close()
    written = {path.name: path.read_text(encoding="utf-8") for path in tmp_path.rglob("*") if path.is_file()}
    errors = [r for r in map(json_module.loads, written["ledger.jsonl"].splitlines()) if r["type"] == "proposal_error"]
    assert len(errors) == 2 and all("[REDACTED]" in r["error"] for r in errors)
    assert not [name for name, text in written.items() if KEY in text]
    assert KEY not in caplog.text


async def test_a_used_up_quota_is_not_retried(server, make_model, backoff_calls) -> None:
    body = {"error": {"message": "You exceeded your current quota.", "type": "insufficient_quota",
                      "code": "insufficient_quota", "param": None}}
    server.fail_next(1, status=429, body=body)
    with pytest.raises(QuotaExceededError, match="exceeded your current quota"):
        await make_model(max_retries=3).complete(MSG)
    assert len(server.chat_requests) == 1


async def test_well_known_models_are_priced_without_configuration(server, make_model, caplog) -> None:
    from opto.llm.prices import known_price

    assert known_price("gpt-4o-mini") is not None and known_price("gpt-test") is None
    model = make_model("gpt-4o-mini")
    await model.complete(MSG)
    assert model.usage.cost_usd > 0
    caplog.set_level(logging.WARNING)
    make_model("my-local-model", budget=Budget(max_cost_usd=1.0))
    assert "has no known price, so Budget(max_cost_usd=1.0) cannot limit" in caplog.text
    caplog.clear()
    make_model("my-local-model", budget=Budget(max_cost_usd=1.0), prices={"my-local-model": {"input": 1, "output": 2}})
    assert "no known price" not in caplog.text
