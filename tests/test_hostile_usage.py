"""Usage from outside opto cannot be forged: negative, fractional or non-numeric token
counts from spans, SDK responses and servers are ignored (and counted in a warning), so
they can neither lower a run's usage nor refund a budget. Also: a span opened inside one
of opto's own model calls, whatever the backend, is counted once."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import openai
import pytest
from pydantic import ValidationError

pytest.importorskip("opentelemetry.sdk", reason="the `otel` extra is part of the test install")
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402

from opto import Agent, Budget, ExactMatchGuide, Example, OpenAIModel, Parameter, ScriptedModel  # noqa: E402
from opto.llm.instrument import instrument  # noqa: E402
from opto.llm.otel import trace_otel  # noqa: E402
from opto.llm.reported import ignored_token_counts, reported_tokens  # noqa: E402
from opto.llm.types import TokenUsage  # noqa: E402
from opto.llm.usage import budget_scope, meter_usage  # noqa: E402
from opto.core.rollout import run_rollout  # noqa: E402
from opto.testing import FakeOpenAIServer, FakeReply  # noqa: E402

HOSTILE = [-500, -1, "12", 3.5, True, float("nan"), float("inf"), [4], {"n": 4}]


@pytest.fixture
def provider():
    made = TracerProvider()
    yield made
    made.shutdown()


@pytest.mark.parametrize("bad", [-1, "5", 2.5, True, None])
def test_token_usage_itself_takes_only_whole_numbers_from_zero(bad):
    with pytest.raises(ValidationError):
        TokenUsage(prompt_tokens=bad)
    with pytest.raises(ValidationError):
        TokenUsage(completion_tokens=bad)
    assert TokenUsage(prompt_tokens=3, completion_tokens=0).total_tokens == 3


def test_reported_counts_keep_whole_numbers_and_ignore_the_rest_with_a_counted_warning(caplog):
    assert reported_tokens(7, field="f", source="test-a") == 7
    assert reported_tokens(7.0, field="f", source="test-a") == 7
    assert reported_tokens(None, field="f", source="test-a") is None
    before = ignored_token_counts().get("test-a", 0)
    with caplog.at_level(logging.WARNING, logger="opto.llm.reported"):
        assert [reported_tokens(bad, field="prompt_tokens", source="test-a") for bad in HOSTILE] == [None] * len(HOSTILE)
    assert ignored_token_counts()["test-a"] == before + len(HOSTILE)
    warned = [r.getMessage() for r in caplog.records if "test-a" in r.getMessage()]
    assert warned and "prompt_tokens=-500" in warned[0] and "whole number >= 0" in warned[0]
    assert len(warned) < len(HOSTILE)  # not one line per bad count: at 1, 10, 100, ...


@pytest.mark.parametrize("convention", ["openinference", "genai"])
def test_hostile_spans_neither_lower_usage_nor_refund_a_budget(provider, convention):
    tracer = provider.get_tracer("hostile")
    handle = trace_otel(provider)
    budget = Budget(max_tokens=1000)

    def span(prompt: Any, completion: Any) -> dict[str, Any]:
        if convention == "openinference":
            return {"openinference.span.kind": "LLM", "llm.model_name": "m", "llm.token_count.prompt": prompt,
                    "llm.token_count.completion": completion}
        return {"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.usage.input_tokens": prompt,
                "gen_ai.usage.output_tokens": completion}

    with budget_scope(budget), meter_usage() as meter:
        with tracer.start_as_current_span("honest", attributes=span(100, 20)):
            pass
        for bad in (-500, "12", 3.5, True, -7.0):
            with tracer.start_as_current_span("hostile", attributes=span(bad, bad)):
                pass
    handle.close()
    assert meter.total.calls == 6  # every call counts
    assert (meter.total.prompt_tokens, meter.total.completion_tokens) == (100, 20)
    assert budget.tokens == 120 and budget.remaining()["tokens"] == 880


def test_a_server_reporting_nonsense_usage_is_charged_its_estimate(caplog):
    replies = iter([FakeReply("four", prompt_tokens=-500, completion_tokens=-9),
                    FakeReply("four", prompt_tokens="lots", completion_tokens=2.5),
                    FakeReply("four", prompt_tokens=30, completion_tokens=4)])
    with FakeOpenAIServer(lambda request: next(replies)) as server:
        model = OpenAIModel("gpt-4o-mini", base_url=server.base_url, api_key="unused", max_retries=0)
        budget = Budget(max_tokens=10_000)
        async def three_calls() -> list[TokenUsage]:
            with budget_scope(budget):
                return [(await model.complete([{"role": "user", "content": "2 + 2?"}])).usage for _ in range(3)]

        with caplog.at_level(logging.WARNING, logger="opto.llm.reported"):
            usages = asyncio.run(three_calls())
    assert all(u.prompt_tokens > 0 and u.completion_tokens > 0 for u in usages[:2])  # estimated, never free
    assert (usages[2].prompt_tokens, usages[2].completion_tokens) == (30, 4)
    assert model.usage.prompt_tokens == sum(u.prompt_tokens for u in usages)
    assert budget.tokens == sum(u.total_tokens for u in usages)
    assert any("-500" in r.getMessage() for r in caplog.records)


def test_an_instrumented_client_ignores_nonsense_usage_in_responses():
    replies = iter([FakeReply("a", prompt_tokens=-500, completion_tokens=-500), FakeReply("b", prompt_tokens=8,
                                                                                          completion_tokens=2)])
    with FakeOpenAIServer(lambda request: next(replies)) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        budget = Budget(max_tokens=1000)
        instrument(client, budget=budget)
        with meter_usage() as meter:
            for _ in range(2):
                client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
    assert meter.total.calls == 2 and meter.total.prompt_tokens == 8 and meter.total.completion_tokens == 2
    assert budget.tokens >= 10


def test_a_span_opened_inside_a_scripted_models_call_is_counted_once(provider):
    tracer = provider.get_tracer("inside")

    def reply(messages: list[dict[str, Any]]) -> str:
        # A backend that is itself instrumented: its span must not count the call again.
        with tracer.start_as_current_span("chat", attributes={"gen_ai.operation.name": "chat",
                                                             "gen_ai.request.model": "inner",
                                                             "gen_ai.usage.input_tokens": 50}):
            return "4"

    class Scripted(Agent):
        def __init__(self) -> None:
            self.model = ScriptedModel(reply, name="scripted")
            self.prompt = Parameter("p")

        async def forward(self, x: str) -> str:
            return (await self.model.complete([{"role": "user", "content": x}])).text

    handle = trace_otel(provider)
    with meter_usage() as meter:
        found = asyncio.run(run_rollout(Scripted(), ExactMatchGuide(), Example(x="2 + 2?", info="4", id="q")))
    handle.close()
    assert [call["model"] for call in found.trace] == ["scripted"]
    assert meter.total.calls == 1 and set(meter.by_model) == {"scripted"}
