"""The embedded model as the optimizer: loops are cut, replies are sized to the parameters."""

from __future__ import annotations

import json
import time

import pytest

from opto import Agent, AggregatedUpdate, ExactMatchGuide, Optimizer, Parameter
from opto.llm import LocalModel, ScriptedModel
from opto.llm.repetition import cut_repetition
from opto.search.proposers import reply_tokens

LOOP = '{"reasoning": "The feedback is that' + " the feedback is that" * 40


def test_a_loop_is_cut_where_it_starts():
    assert cut_repetition(LOOP) == '{"reasoning": "The feedback is that the feedback is that'
    cut_mid_unit = LOOP + " the feedb"
    assert cut_repetition(cut_mid_unit).startswith('{"reasoning": "The feedback is that')
    assert len(cut_repetition(cut_mid_unit)) < 80
    assert cut_repetition("a" * 60) == "a"


@pytest.mark.parametrize(
    "text",
    ["very very good", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10", '{"reasoning": "fine", "suggestion": {"p": "ha ha ha"}}', ""],
)
def test_ordinary_text_is_not_cut(text):
    assert cut_repetition(text) is None


def test_auto_max_tokens_scales_with_the_values_rewritten():
    short, long = Parameter("Answer."), Parameter("x" * 3000)
    assert reply_tokens([short]) == 256 + len("Answer.") // 2
    assert reply_tokens([long]) == 256 + 1500
    assert reply_tokens([long, long]) == 2048  # capped


class Echo(Agent):
    def __init__(self) -> None:
        self.prompt = Parameter("Answer the question.", description="system prompt")

    def forward(self, x: str) -> str:
        return "yes" if "yes" in self.prompt.value else "no"


def test_the_optimizer_asks_for_the_auto_limit():
    brain = ScriptedModel(lambda messages: json.dumps({"suggestion": {"prompt": "Say yes."}}))
    AggregatedUpdate(Echo(), Optimizer(brain)).train(ExactMatchGuide(), [("q", "yes")] * 4, batch_size=4,
                                                      progress=False)
    asked = [r["max_tokens"] for r in brain.requests]
    assert asked == [256 + len("Answer the question.") // 2]


async def test_a_looping_local_reply_is_cut_and_counted_as_truncated(monkeypatch):
    model = LocalModel()  # the embedded model's file; no weights are loaded here
    reply = {"choices": [{"message": {"content": LOOP}, "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 10, "completion_tokens": 300}}
    monkeypatch.setattr(model, "_chat", lambda kwargs: reply)
    try:
        completion = await model.complete([{"role": "user", "content": "hi"}], max_tokens=300)
    finally:
        model.close()
    assert completion.truncated and completion.texts[0] == cut_repetition(LOOP)


@pytest.mark.local_model
def test_a_step_with_the_embedded_model_as_optimizer_takes_seconds():
    model = LocalModel()
    try:
        started = time.monotonic()
        result = AggregatedUpdate(Echo(), Optimizer(model)).train(
            ExactMatchGuide(), [(f"question {i}", "yes") for i in range(4)], batch_size=4, progress=False
        )
        elapsed = time.monotonic() - started
    finally:
        model.close()
    assert result.steps == 1 and model.usage.calls >= 1
    # Bounded by the auto limit: 256 + 10 tokens, not 2048 (a behaviour, not a benchmark:
    # the bound is generous for a slow machine).
    assert model.usage.completion_tokens <= model.usage.calls * (256 + len("Answer the question.") // 2)
    assert elapsed < 120, f"one step took {elapsed:.0f} s"


def test_the_aggregator_sizes_its_reply_to_the_longest_suggestion():
    suggestions = iter(["Say yes.", "Say yes, always, whatever the question is about."])

    def reply(messages):
        if "merge several suggested updates" in messages[0]["content"]:
            return json.dumps({"suggestion": {"prompt": "Say yes."}})
        return json.dumps({"suggestion": {"prompt": next(suggestions)}})

    brain = ScriptedModel(reply)
    AggregatedUpdate(Echo(), Optimizer(brain), proposals="per_instance").train(
        ExactMatchGuide(), [("q1", "yes"), ("q2", "yes")], batch_size=2, progress=False
    )
    merged = [r for r in brain.requests if "merge several" in r["messages"][0]["content"]]
    longest = len("Say yes, always, whatever the question is about.")
    assert [r["max_tokens"] for r in merged] == [256 + longest // 2]
