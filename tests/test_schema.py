"""Structured replies: schemas built from parameters, and how backends receive them."""

import asyncio
import json

from opto import Constraint, Optimizer, Parameter
from opto.llm import OpenAIModel, ScriptedModel
from opto.llm.local import _llama_format
from opto.core.rollout import Rollout
from opto.core.schema import parameter_schema, reply_format
from opto.testing import FakeOpenAIServer


def test_parameter_schema_carries_type_and_checkable_constraints():
    assert parameter_schema(Parameter("x")) == {"type": "string"}
    assert parameter_schema(Parameter(True)) == {"type": "boolean"}
    assert parameter_schema(Parameter(3, constraint=Constraint(min=1, max=5))) == {
        "type": "integer", "minimum": 1, "maximum": 5}
    assert parameter_schema(Parameter("a", constraint=Constraint(choices=["a", "b"], max_length=3))) == {
        "type": "string", "enum": ["a", "b"], "maxLength": 3}
    assert parameter_schema(Parameter([1], constraint=Constraint(max_length=4)))["maxItems"] == 4
    assert parameter_schema(Parameter(0.5))["type"] == "number"


def test_reply_format_requires_every_trainable_parameter_only():
    params = [Parameter("p", name="prompt"), Parameter(2, name="k"), Parameter("f", name="fixed", trainable=False)]
    fmt = reply_format(params, ["reasoning"], "proposal")
    schema = fmt["json_schema"]["schema"]
    assert fmt["type"] == "json_schema"
    assert schema["required"] == ["reasoning", "suggestion"]
    assert schema["properties"]["suggestion"]["required"] == ["prompt", "k"]
    assert "fixed" not in schema["properties"]["suggestion"]["properties"]


def test_llama_gets_its_own_schema_form():
    fmt = reply_format([Parameter("p", name="prompt")], ["reasoning"], "proposal")
    converted = _llama_format(fmt)
    assert converted["type"] == "json_object"
    assert converted["schema"] == fmt["json_schema"]["schema"]
    assert _llama_format({"type": "json_object"}) == {"type": "json_object"}


def test_optimizer_sends_the_schema_and_plain_json_mode_when_asked():
    model = ScriptedModel(['{"reasoning": "r", "suggestion": {"prompt": "new"}}'] * 2)
    params = [Parameter("old", name="prompt")]
    rollout = Rollout(example_id="1", x="q", output="a", score=0.0, feedback="wrong")
    proposals = asyncio.run(Optimizer(model).propose(params, rollout))
    assert proposals[0].update == {"prompt": "new"}
    assert model.requests[0]["response_format"]["type"] == "json_schema"
    asyncio.run(Optimizer(model, structured=False).propose(params, rollout))
    assert model.requests[1]["response_format"] == {"type": "json_object"}


def test_openai_model_steps_down_from_schema_to_json_mode_to_none():
    with FakeOpenAIServer(reply='{"suggestion": {}}') as server:
        server.reject_response_format = True
        model = OpenAIModel("m", base_url=server.base_url, api_key="k", max_retries=0)
        fmt = reply_format([Parameter("p", name="prompt")], ["reasoning"], "proposal")
        reply = asyncio.run(model.complete([{"role": "user", "content": "hi"}], response_format=fmt))
        again = asyncio.run(model.complete([{"role": "user", "content": "hi"}], response_format=fmt))
        sent = [r.get("response_format", {}).get("type") for r in server.chat_requests]
        model.close()
    assert json.loads(reply.text) == {"suggestion": {}} and again.text == reply.text
    # schema rejected, JSON mode rejected, then plain; the next call goes straight to plain.
    assert sent == ["json_schema", "json_object", None, None]
