"""Tests of the offline OpenAI fake, driven by the real openai SDK and by raw urllib."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest
from openai.types import FileObject
from openai.types.chat import ChatCompletion
from openai.types.fine_tuning import FineTuningJob, FineTuningJobEvent

from opto.testing import FakeOpenAIServer, FakeReply, LognormalLatency, RecordedRequest

USER = [{"role": "user", "content": "What is two plus two?"}]


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as srv:
        yield srv


@pytest.fixture
async def client(server: FakeOpenAIServer) -> AsyncIterator[openai.AsyncOpenAI]:
    # max_retries=0 so injected faults surface instead of being retried away.
    async with openai.AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0) as c:
        yield c


def raw_request(
    server: FakeOpenAIServer, method: str, path: str, body: Any = None
) -> tuple[int, dict[str, str], bytes]:
    """Send one request with urllib (bytes as is, anything else as JSON); returns (status, headers, body)."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(server.base_url + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


async def upload(client: openai.AsyncOpenAI, content: bytes = b'{"messages": []}\n') -> FileObject:
    return await client.files.create(file=("train.jsonl", content, "application/jsonl"), purpose="fine-tune")


# -- chat completions ---------------------------------------------------------


async def test_default_reply_echoes_last_user_message_with_n_choices(server, client) -> None:
    messages = [{"role": "system", "content": "Be terse."}, *USER]
    completion = await client.chat.completions.create(model="gpt-4o-mini", messages=messages, n=3)

    assert [c.index for c in completion.choices] == [0, 1, 2]
    assert all(c.message.content == "echo: What is two plus two?" for c in completion.choices)
    assert all(c.finish_reason == "stop" for c in completion.choices)
    assert completion.model == "gpt-4o-mini"
    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert server.chat_requests == [{"model": "gpt-4o-mini", "messages": messages, "n": 3}]


def test_chat_response_validates_strictly_against_sdk_model(server) -> None:
    status, headers, body = raw_request(server, "POST", "/chat/completions", {"model": "m", "messages": USER})

    assert status == 200
    assert headers["content-length"] == str(len(body))
    completion = ChatCompletion.model_validate(json.loads(body))  # strict: all required fields present
    assert completion.choices[0].message.content == "echo: What is two plus two?"


async def test_reply_list_is_returned_in_order_then_repeats_last() -> None:
    with FakeOpenAIServer(reply=["first", "second"]) as srv:
        async with openai.AsyncOpenAI(base_url=srv.base_url, api_key="test", max_retries=0) as c:
            texts = [
                (await c.chat.completions.create(model="m", messages=USER)).choices[0].message.content
                for _ in range(3)
            ]
    assert texts == ["first", "second", "second"]


async def test_callable_reply_sees_the_request_and_controls_choices_and_usage() -> None:
    seen: list[dict[str, Any]] = []

    def reply(request: dict[str, Any]) -> FakeReply:
        seen.append(request)
        texts = [f"{request['messages'][-1]['content']} #{i}" for i in range(request.get("n", 1))]
        return FakeReply(texts, finish_reason="length", prompt_tokens=11, completion_tokens=7)

    with FakeOpenAIServer(reply=reply) as srv:
        async with openai.AsyncOpenAI(base_url=srv.base_url, api_key="test", max_retries=0) as c:
            completion = await c.chat.completions.create(
                model="m", messages=USER, n=2, temperature=0.5, response_format={"type": "json_object"}
            )

    assert seen[0]["temperature"] == 0.5 and seen[0]["response_format"] == {"type": "json_object"}
    texts = [c.message.content for c in completion.choices]
    assert texts == ["What is two plus two? #0", "What is two plus two? #1"]
    assert {c.finish_reason for c in completion.choices} == {"length"}
    usage = completion.usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (11, 7, 18)


async def test_callable_returning_a_string_uses_it_for_every_choice() -> None:
    with FakeOpenAIServer(reply=lambda request: "same") as srv:
        async with openai.AsyncOpenAI(base_url=srv.base_url, api_key="test", max_retries=0) as c:
            completion = await c.chat.completions.create(model="m", messages=USER, n=2)
    assert [c.message.content for c in completion.choices] == ["same", "same"]


WIRE_CALL = {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
FLAT_CALL = {"name": "get_time", "arguments": {"zone": "CET"}}


async def test_tool_calls_in_the_wire_shape_and_the_flat_shape_are_both_sent() -> None:
    reply = FakeReply("", tool_calls=[WIRE_CALL, FLAT_CALL])
    with FakeOpenAIServer(reply=lambda request: reply) as srv:
        async with openai.AsyncOpenAI(base_url=srv.base_url, api_key="test", max_retries=0) as c:
            completion = await c.chat.completions.create(model="m", messages=USER)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None and [c.function.name for c in calls] == ["get_weather", "get_time"]
    assert calls[0].id == "call_1" and calls[1].id.startswith("call")  # a given id is kept, a missing one made up
    assert [json.loads(c.function.arguments) for c in calls] == [{"city": "Paris"}, {"zone": "CET"}]


@pytest.mark.parametrize("call", [
    "get_weather",
    {"arguments": {}},
    {"name": "f", "arguments": 3},
    {"type": "function", "function": {"arguments": "{}"}},
    {"type": "web_search", "function": {"name": "f"}},
    {"id": 7, "name": "f"},
], ids=["text", "no-name", "number-arguments", "wire-without-name", "not-a-function", "number-id"])
def test_a_tool_call_of_another_shape_is_refused_when_the_reply_is_built(call: Any) -> None:
    with pytest.raises(ValueError, match='cannot script the tool call.*"type": "function"'):
        FakeReply("", tool_calls=[call])


async def test_fake_reply_with_error_status_becomes_an_api_error() -> None:
    with FakeOpenAIServer(reply=lambda request: FakeReply("context too long", status=400)) as srv:
        async with openai.AsyncOpenAI(base_url=srv.base_url, api_key="test", max_retries=0) as c:
            with pytest.raises(openai.BadRequestError) as info:
                await c.chat.completions.create(model="m", messages=USER)
    assert info.value.body["message"] == "context too long"


async def test_a_crashing_reply_callable_surfaces_as_500() -> None:
    def reply(request: dict[str, Any]) -> str:
        raise RuntimeError("boom")

    with FakeOpenAIServer(reply=reply) as srv:
        async with openai.AsyncOpenAI(base_url=srv.base_url, api_key="test", max_retries=0) as c:
            with pytest.raises(openai.InternalServerError) as info:
                await c.chat.completions.create(model="m", messages=USER)
        assert "RuntimeError: boom" in info.value.body["message"]
        assert len(srv.chat_requests) == 1


# -- fault injection ------------------------------------------------------------


async def test_fail_next_429_carries_retry_after_and_openai_error_shape(server, client) -> None:
    server.fail_next(status=429, retry_after=3, retry_after_ms=2500)

    with pytest.raises(openai.RateLimitError) as info:
        await client.chat.completions.create(model="m", messages=USER)

    assert info.value.response.headers["retry-after"] == "3"
    assert info.value.response.headers["retry-after-ms"] == "2500"
    assert info.value.body["type"] == "requests" and info.value.body["code"] == "rate_limit_exceeded"
    # The fault was used up: the next request succeeds, and both were recorded.
    ok = await client.chat.completions.create(model="m", messages=USER)
    assert ok.choices[0].message.content.startswith("echo:")
    assert len(server.chat_requests) == 2


async def test_faults_apply_fifo_one_per_request(server, client) -> None:
    server.fail_next(n=2, status=500)
    server.fail_next(status=503, body={"error": {"message": "custom", "type": "server_error", "code": None}})

    for expected in (500, 500, 503):
        with pytest.raises(openai.InternalServerError) as info:
            await client.chat.completions.create(model="m", messages=USER)
        assert info.value.status_code == expected
    assert info.value.body["message"] == "custom"
    assert (await client.chat.completions.create(model="m", messages=USER)).choices


async def test_malformed_body_raises_in_the_sdk(server, client) -> None:
    server.malformed_next()

    with pytest.raises(json.JSONDecodeError):
        await client.chat.completions.create(model="m", messages=USER)
    assert (await client.chat.completions.create(model="m", messages=USER)).choices  # keep-alive still usable


async def test_hang_exceeds_client_timeout_and_stop_returns_promptly() -> None:
    srv = FakeOpenAIServer().start()
    try:
        srv.hang_next(seconds=30)
        async with openai.AsyncOpenAI(base_url=srv.base_url, api_key="test", max_retries=0, timeout=0.3) as c:
            started = time.monotonic()
            with pytest.raises(openai.APITimeoutError):
                await c.chat.completions.create(model="m", messages=USER)
            assert time.monotonic() - started < 2
            # Leave the pooled client open too: stop() must not wait for idle connections either.
            srv.hang_next(seconds=30)
            pending = asyncio.ensure_future(c.chat.completions.create(model="m", messages=USER, timeout=10))
            await asyncio.sleep(0.2)  # the request is now sleeping in the server
            started = time.monotonic()
            srv.stop()
            assert time.monotonic() - started < 2
            with pytest.raises(openai.APIConnectionError):
                await pending
    finally:
        srv.stop()


async def test_peak_in_flight_counts_concurrent_requests(server, client) -> None:
    server.latency = 0.2

    started = time.monotonic()
    replies = await asyncio.gather(*(client.chat.completions.create(model="m", messages=USER) for _ in range(8)))

    assert len(replies) == 8
    assert server.peak_in_flight == 8
    assert time.monotonic() - started < 1.5  # handled in parallel, not one after another


async def test_a_lognormal_latency_is_drawn_per_request_and_recorded(server, client) -> None:
    server.latency = LognormalLatency(median=0.02, sigma=0.8, seed=3)
    expected = LognormalLatency(median=0.02, sigma=0.8, seed=3)

    started = time.monotonic()
    for i in range(4):
        await client.chat.completions.create(model=f"m{i}", messages=USER)
    waited = time.monotonic() - started

    drawn = server.chat_latencies
    assert [body["model"] for body, _ in drawn] == ["m0", "m1", "m2", "m3"]
    assert [seconds for _, seconds in drawn] == [expected.draw() for _ in range(4)]  # seeded
    assert len({seconds for _, seconds in drawn}) == 4  # spread, not fixed
    assert waited >= sum(seconds for _, seconds in drawn)


def test_a_lognormal_latency_refuses_a_median_or_sigma_it_cannot_use() -> None:
    with pytest.raises(ValueError, match="median must be > 0"):
        LognormalLatency(median=0, sigma=0.5)
    with pytest.raises(ValueError, match="sigma must be >= 0"):
        LognormalLatency(median=0.1, sigma=-1)


async def test_sequential_requests_have_peak_in_flight_one(server, client) -> None:
    for _ in range(3):
        await client.chat.completions.create(model="m", messages=USER)
    assert server.peak_in_flight == 1


async def test_reject_response_format(server, client) -> None:
    server.reject_response_format = True

    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="m", messages=USER, response_format={"type": "json_object"})

    assert info.value.body["type"] == "invalid_request_error"
    assert info.value.body["param"] == "response_format"
    assert (await client.chat.completions.create(model="m", messages=USER)).choices  # without it: fine


# -- raw HTTP details -----------------------------------------------------------


def test_unknown_route_is_a_404_error_and_every_request_is_recorded(server) -> None:
    status, _, body = raw_request(server, "GET", "/nope?x=1")

    assert status == 404
    assert "Unknown route" in json.loads(body)["error"]["message"]
    [request] = server.requests
    assert isinstance(request, RecordedRequest)
    assert (request.method, request.path, request.json) == ("GET", "/v1/nope?x=1", None)
    assert request.headers["content-type"] == "application/json"  # keys lowercased


def test_non_json_chat_body_is_a_400(server) -> None:
    status, _, body = raw_request(server, "POST", "/chat/completions", b"not json")

    assert status == 400
    assert json.loads(body)["error"]["type"] == "invalid_request_error"
    assert server.requests[0].body == b"not json"


def test_requests_property_returns_a_copy(server) -> None:
    raw_request(server, "GET", "/files")
    server.requests.clear()
    assert len(server.requests) == 1


# -- files --------------------------------------------------------------------


async def test_file_upload_stores_content_and_can_be_retrieved(server, client) -> None:
    content = b'{"messages": [{"role": "user", "content": "hi"}]}\r\n{"messages": []}\n'

    uploaded = await upload(client, content)

    assert uploaded.id.startswith("file-")
    assert (uploaded.filename, uploaded.purpose, uploaded.bytes, uploaded.status) == (
        "train.jsonl", "fine-tune", len(content), "processed",
    )
    stored = server.files[uploaded.id]
    assert (stored.content, stored.filename, stored.purpose) == (content, "train.jsonl", "fine-tune")
    assert (await client.files.retrieve(uploaded.id)).id == uploaded.id
    status, _, body = raw_request(server, "GET", f"/files/{uploaded.id}")
    assert status == 200
    FileObject.model_validate(json.loads(body))
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve("file-missing")


# -- fine-tuning ----------------------------------------------------------------


async def test_fine_tuning_job_walks_the_script_to_succeeded(server, client) -> None:
    training = await upload(client)

    job = await client.fine_tuning.jobs.create(
        model="gpt-4o-mini", training_file=training.id, suffix="opt", seed=7, hyperparameters={"n_epochs": 2}
    )
    statuses = [job.status]
    while job.status not in ("succeeded", "failed"):
        job = await client.fine_tuning.jobs.retrieve(job.id)
        statuses.append(job.status)

    assert job.id.startswith("ftjob-") and job.object == "fine_tuning.job"
    assert statuses == ["validating_files", "queued", "running", "succeeded"]
    assert job.fine_tuned_model == f"ft:gpt-4o-mini:opt:{job.id.removeprefix('ftjob-')[:8]}"
    assert job.finished_at is not None and job.error is None
    assert (job.seed, job.hyperparameters.n_epochs, job.training_file) == (7, 2, training.id)
    # Terminal: a further GET does not change anything.
    assert (await client.fine_tuning.jobs.retrieve(job.id)).status == "succeeded"
    FineTuningJob.model_validate(server.jobs[job.id])  # strict: every required field present


async def test_fine_tuning_job_failure_sets_error_and_events(server, client) -> None:
    server.job_script = ["validating_files", "failed"]
    training = await upload(client)
    job = await client.fine_tuning.jobs.create(model="gpt-4o-mini", training_file=training.id)

    job = await client.fine_tuning.jobs.retrieve(job.id)

    assert job.status == "failed" and job.fine_tuned_model is None
    assert job.error is not None
    assert (job.error.code, job.error.param) == ("invalid_training_file", "training_file")
    events = (await client.fine_tuning.jobs.list_events(job.id)).data
    assert all(isinstance(e, FineTuningJobEvent) and e.object == "fine_tuning.job.event" for e in events)
    messages = [e.message for e in reversed(events)]  # the API lists newest first
    assert messages[1:] == [
        "Job status changed to validating_files",
        "Job status changed to failed",
        job.error.message,
    ]
    assert events[0].level == "error"


async def test_fine_tuning_list_and_cancel(server, client) -> None:
    training = await upload(client)
    first = await client.fine_tuning.jobs.create(model="a", training_file=training.id)
    second = await client.fine_tuning.jobs.create(model="b", training_file=training.id, validation_file=training.id)

    listed = await client.fine_tuning.jobs.list()
    assert [j.id for j in listed.data] == [second.id, first.id]
    assert listed.has_more is False

    cancelled = await client.fine_tuning.jobs.cancel(first.id)
    assert cancelled.status == "cancelled"
    assert (await client.fine_tuning.jobs.retrieve(first.id)).status == "cancelled"
    assert server.jobs[first.id]["status"] == "cancelled"
    with pytest.raises(openai.BadRequestError):  # already finished
        await client.fine_tuning.jobs.cancel(first.id)


async def test_fine_tuning_errors(server, client) -> None:
    training = await upload(client)

    with pytest.raises(openai.BadRequestError) as info:
        await client.fine_tuning.jobs.create(model="m", training_file="file-unknown")
    assert info.value.body["param"] == "training_file"

    server.fail_fine_tuning_create(status=403, message="Fine-tuning is not available for this org.")
    with pytest.raises(openai.PermissionDeniedError) as refused:
        await client.fine_tuning.jobs.create(model="m", training_file=training.id)
    assert refused.value.body["message"] == "Fine-tuning is not available for this org."
    assert server.jobs == {}
    # One-shot: the next create goes through.
    assert (await client.fine_tuning.jobs.create(model="m", training_file=training.id)).status == "validating_files"

    jobs = client.fine_tuning.jobs
    for call in (jobs.retrieve, jobs.cancel, jobs.list_events):
        with pytest.raises(openai.NotFoundError):
            await call("ftjob-missing")
