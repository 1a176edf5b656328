"""The per-instance Optimizer: its prompt, its request, and reading its replies."""

import asyncio
import json
import random
import re

import pytest

from opto import Constraint, Optimizer, Parameter, Rollout
from opto.llm import LLMError, ScriptedModel

JSON_FORMATS = ("json_object", "json_schema")


def params():
    return [
        Parameter("Answer the question.", name="system_prompt", description="the agent's system prompt",
                  constraint=Constraint("plain instructions", max_length=200)),
        Parameter(3, name="k", description="how many examples", constraint=Constraint(min=1, max=10)),
        Parameter(["ex 1", "ex 2"], name="shots", description="few-shot examples"),
        Parameter("fixed text", name="style", description="a fixed setting", trainable=False),
    ]


def rollout(example_id="q7", x="How many legs has a spider?", output="six", score=0.0, feedback="Expected 8."):
    trace = [{
        "model": "agent-model",
        "messages": [{"role": "system", "content": "Answer the question."},
                     {"role": "user", "content": x}],
        "response": output,
        "cached": False,
    }]
    return Rollout(example_id=example_id, x=x, info="8", output=output, score=score, feedback=feedback,
                   trace=trace)


def user_text(request):
    return next(m["content"] for m in request["messages"] if m["role"] == "user")


async def test_prompt_shows_parameters_input_trace_output_score_and_feedback():
    model = ScriptedModel([json.dumps({"reasoning": "r", "suggestion": {"k": 4}})])
    optimizer = Optimizer(model)
    await optimizer.propose(params(), rollout())
    [request] = model.requests
    text = user_text(request)

    for name, kind, description in [("system_prompt", "str", "the agent's system prompt"),
                                    ("k", "int", "how many examples"),
                                    ("shots", "list", "few-shot examples"),
                                    ("style", "str", "a fixed setting")]:
        assert f"## {name}\n- type: {kind}" in text
        assert f"- description: {description}" in text
    assert "- constraint: plain instructions; length at most 200" in text
    assert "- constraint: >= 1; <= 10" in text
    assert "- trainable: no (fixed)" in text and "- trainable: yes" in text
    # current values as JSON, not Python repr
    assert '- current value: "Answer the question."' in text
    assert "- current value: 3" in text
    assert '- current value: [\n  "ex 1",\n  "ex 2"\n]' in text
    assert "['ex 1', 'ex 2']" not in text
    # the instance
    assert '# Input\n"How many legs has a spider?"' in text
    assert "## Call 1 (agent-model)" in text
    assert "[system] Answer the question." in text and "[user] How many legs has a spider?" in text
    assert "[reply] six" in text
    assert '# Output\n"six"' in text
    assert "score: 0.0" in text
    assert "Expected 8." in text

    assert request["messages"][0]["role"] == "system"
    assert "Reply with one JSON object" in request["messages"][0]["content"]


async def test_json_mode_is_requested_with_the_settings():
    model = ScriptedModel([json.dumps({"suggestion": {"k": 4}})])
    await Optimizer(model, temperature=0.7, max_tokens=321).propose(params(), rollout())
    [request] = model.requests
    assert request["response_format"]["type"] in JSON_FORMATS
    assert request["temperature"] == 0.7 and request["max_tokens"] == 321 and request["n"] == 1


async def test_plain_json_mode_when_not_structured():
    model = ScriptedModel([json.dumps({"suggestion": {"k": 4}})])
    [proposal] = await Optimizer(model, structured=False).propose(params(), rollout())
    assert model.requests[0]["response_format"] == {"type": "json_object"}
    assert proposal.update == {"k": 4}


async def test_a_readable_reply_becomes_a_checked_proposal():
    text = json.dumps({"reasoning": "Ask for a number.",
                       "suggestion": {"system_prompt": "Answer with a number.", "k": "5", "style": "changed",
                                      "nope": 1}})
    model = ScriptedModel([text])
    [proposal] = await Optimizer(model).propose(params(), rollout(example_id="abc"))
    assert proposal.instance_id == "abc"
    assert proposal.update == {"system_prompt": "Answer with a number.", "k": 5}
    assert {s["name"] for s in proposal.skipped} == {"style", "nope"}
    assert proposal.reasoning == "Ask for a number."
    assert proposal.raw_response == text
    assert proposal.extraction_method is not None
    assert proposal.prompt_messages == model.requests[0]["messages"]
    assert proposal.truncated is False


async def test_num_proposals_asks_for_n_samples_and_returns_each():
    replies = [json.dumps({"suggestion": {"k": k}}) for k in (4, 5, 6)]
    model = ScriptedModel(replies)
    proposals = await Optimizer(model, num_proposals=3).propose(params(), rollout())
    assert len(model.requests) == 1 and model.requests[0]["n"] == 3
    assert [p.update for p in proposals] == [{"k": 4}, {"k": 5}, {"k": 6}]
    assert [p.sample_index for p in proposals] == [0, 1, 2]
    assert len({p.proposal_id for p in proposals}) == 3


def test_num_proposals_must_be_positive():
    with pytest.raises(ValueError, match="num_proposals"):
        Optimizer(ScriptedModel([]), num_proposals=0)


async def test_unreadable_reply_gives_an_empty_proposal():
    model = ScriptedModel(["I would change several things, honestly."])
    [proposal] = await Optimizer(model).propose(params(), rollout())
    assert proposal.update == {}
    assert proposal.extraction_method is None
    assert proposal.raw_response == "I would change several things, honestly."
    assert len(model.requests) == 1  # the optimizer does not ask again


async def test_an_empty_suggestion_is_no_change():
    model = ScriptedModel([json.dumps({"reasoning": "fine as is", "suggestion": {}})])
    [proposal] = await Optimizer(model).propose(params(), rollout())
    assert proposal.update == {}
    assert proposal.reasoning == "fine as is"


async def test_values_equal_to_the_current_ones_are_left_out():
    model = ScriptedModel([json.dumps({"suggestion": {"k": 3, "system_prompt": "Answer the question."}})])
    [proposal] = await Optimizer(model).propose(params(), rollout())
    assert proposal.update == {} and proposal.skipped == []


async def test_model_errors_propagate():
    model = ScriptedModel([LLMError("down")])
    with pytest.raises(LLMError, match="down"):
        await Optimizer(model).propose(params(), rollout())


async def test_concurrent_propose_calls_do_not_interfere():
    rng = random.Random(7)
    delays = [rng.random() * 0.003 for _ in range(200)]
    calls = iter(range(10_000))

    async def respond(messages):
        text = messages[-1]["content"]
        question = re.search(r'# Input\n"question (\d+)"', text).group(1)
        await asyncio.sleep(delays[next(calls) % len(delays)])
        return json.dumps({"reasoning": f"for {question}",
                           "suggestion": {"system_prompt": f"prompt for {question}"}})

    model = ScriptedModel(respond)
    optimizer = Optimizer(model)
    shared = params()
    instances = [rollout(example_id=f"id{i}", x=f"question {i}", feedback=f"feedback {i}") for i in range(40)]
    results = await asyncio.gather(*(optimizer.propose(shared, r) for r in instances))

    assert len(model.requests) == 40
    for i, proposals in enumerate(results):
        [proposal] = proposals
        assert proposal.instance_id == f"id{i}"
        assert proposal.update == {"system_prompt": f"prompt for {i}"}
        assert proposal.reasoning == f"for {i}"
        text = user_text({"messages": proposal.prompt_messages})
        assert f'"question {i}"' in text and f"feedback {i}" in text
        assert all(f'"question {j}"' not in text for j in range(40) if j != i)
    assert shared[0].value == "Answer the question."  # proposing never writes a parameter


async def test_values_no_parameter_can_hold_are_skipped_with_the_reason_in_the_proposal():
    from opto import Optimizer, Parameter
    from opto.llm import ScriptedModel
    from opto.core.rollout import Rollout

    params = [Parameter(0.5, name="temperature"), Parameter("Answer.", name="prompt")]
    model = ScriptedModel(['{"suggestion": {"temperature": NaN, "prompt": "Be brief \\ud83d"}}'])
    [proposal] = await Optimizer(model, structured=False).propose(params, Rollout(example_id="1", x="q"))
    assert proposal.update == {"prompt": "Be brief \ufffd"}
    assert proposal.skipped == [{"name": "temperature", "value": "nan", "reason": "nan is not a finite number"}]
