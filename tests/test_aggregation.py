"""The Aggregator: prompt contents, dedupe, TERMINATE, repair, grouping, samples, coercion."""

import json
import re

import pytest

from opto import Aggregator, Completion, Constraint, Parameter, Proposal
from opto.llm import LLMError, ScriptedModel


def params():
    return [
        Parameter("Answer the question.", name="prompt", description="system prompt"),
        Parameter(3, name="k", constraint=Constraint(min=1, max=10)),
        Parameter("fixed", name="style", trainable=False),
    ]


def proposal(update, reasoning="because", pid=None):
    kwargs = {"update": update, "reasoning": reasoning}
    if pid:
        kwargs["proposal_id"] = pid
    return Proposal(**kwargs)


def user_text(request):
    return next(m["content"] for m in request["messages"] if m["role"] == "user")


def suggestions_in(request):
    """The numbers of the proposal suggestions in a prompt (suggestion 0 is the current values)."""
    numbers = [int(n) for n in re.findall(r"^# Suggestion (\d+)", user_text(request), re.MULTILINE)]
    assert numbers and numbers[0] == 0
    return numbers[1:]


JSON_FORMATS = ("json_object", "json_schema")


def reply(update, reasoning="merged"):
    return json.dumps({"reasoning": reasoning, "suggestion": update})


# --------------------------------------------------------------------------- prompt


async def test_prompt_shows_current_values_as_suggestion_0_and_proposals_with_stepsize():
    model = ScriptedModel([reply({"prompt": "Merged prompt."})])
    aggregator = Aggregator(model)
    proposals = [proposal({"prompt": "Think step by step."}, "be careful"), proposal({"k": 5}, "more context")]
    [candidate] = await aggregator.aggregate(params(), proposals, stepsize=0.3)

    [request] = model.requests
    text = user_text(request)
    assert "# Suggestion 0: the current values (confidence 0.70)" in text
    current_json = json.dumps({"prompt": "Answer the question.", "k": 3}, indent=2)
    assert current_json in text  # current values of the trainable parameters, as JSON
    assert "# Suggestion 1 (confidence 0.30)" in text
    assert "# Suggestion 2 (confidence 0.30)" in text
    assert "Reasoning: be careful" in text and "Reasoning: more context" in text
    assert "## prompt" in text and "- description: system prompt" in text and ">= 1; <= 10" in text
    assert "## style" not in text  # not trainable: not offered for merging
    assert request["messages"][0]["role"] == "system"
    assert request["messages"][0]["content"] == aggregator.system_prompt
    assert request["response_format"]["type"] in JSON_FORMATS
    assert request["n"] == 1

    assert candidate.update == {"prompt": "Merged prompt."}
    assert candidate.reasoning == "merged"
    assert candidate.terminate is False and candidate.error is None
    assert candidate.source_proposals == [p.proposal_id for p in proposals]
    assert candidate.prompt_messages == request["messages"]
    assert candidate.raw_response == reply({"prompt": "Merged prompt."})


async def test_prompt_shows_each_suggested_update_as_json_once():
    model = ScriptedModel([reply({"k": 5})])
    proposals = [proposal({"prompt": "Think step by step."}), proposal({"k": 5}), proposal({"k": 5})]
    await Aggregator(model).aggregate(params(), proposals, stepsize=0.5)
    text = user_text(model.requests[0])
    assert "built-in method" not in text
    assert '"prompt": "Think step by step."' in text
    assert text.count('"k": 5') == 1


async def test_plain_json_mode_when_not_structured():
    model = ScriptedModel(["not json", reply({"k": 4})])
    [candidate] = await Aggregator(model, structured=False).aggregate(params(), [proposal({"k": 4})], 0.5)
    assert [r["response_format"] for r in model.requests] == [{"type": "json_object"}] * 2  # repair too
    assert candidate.update == {"k": 4}


async def test_stepsize_changes_the_confidences():
    model = ScriptedModel([reply({"k": 4})])
    await Aggregator(model).aggregate(params(), [proposal({"k": 4})], stepsize=0.75)
    text = user_text(model.requests[0])
    assert "(confidence 0.25)" in text and "# Suggestion 1 (confidence 0.75)" in text


async def test_stepsize_out_of_range_is_an_error():
    model = ScriptedModel([])
    with pytest.raises(ValueError, match="stepsize"):
        await Aggregator(model).aggregate(params(), [proposal({"k": 4})], stepsize=1.5)


async def test_duplicate_proposals_are_shown_once_with_their_count():
    model = ScriptedModel([reply({"k": 5})])
    same_a, same_b = proposal({"k": 5}, pid="p-a"), proposal({"k": 5}, pid="p-b")
    other = proposal({"prompt": "Other."}, pid="p-c")
    [candidate] = await Aggregator(model).aggregate(params(), [same_a, other, same_b], stepsize=0.5)
    text = user_text(model.requests[0])
    assert suggestions_in(model.requests[0]) == [1, 2]
    assert "# Suggestion 1 (confidence 0.50, proposed 2 times)" in text
    assert "# Suggestion 2 (confidence 0.50)\n" in text
    assert sorted(candidate.source_proposals) == ["p-a", "p-b", "p-c"]


async def test_no_proposal_with_an_update_gives_no_candidate_and_no_call():
    model = ScriptedModel([])
    aggregator = Aggregator(model)
    assert await aggregator.aggregate(params(), [], stepsize=0.5) == []
    assert await aggregator.aggregate(params(), [proposal({}), proposal({})], stepsize=0.5) == []
    assert model.requests == []


# ------------------------------------------------------------------ reading replies


async def test_terminate_gives_a_terminate_candidate_with_no_update():
    model = ScriptedModel(["TERMINATE"])
    [candidate] = await Aggregator(model).aggregate(params(), [proposal({"k": 4})], stepsize=0.5)
    assert candidate.terminate is True
    assert candidate.update == {}
    assert candidate.error is None and candidate.repaired is False
    assert len(model.requests) == 1  # TERMINATE is an answer, not something to repair


async def test_garbage_reply_gets_exactly_one_repair_request_with_the_bad_reply():
    garbage = "I think the prompt should be better, maybe."
    model = ScriptedModel([garbage, reply({"prompt": "Repaired."})])
    [candidate] = await Aggregator(model).aggregate(params(), [proposal({"prompt": "X."})], stepsize=0.5)
    assert len(model.requests) == 2
    first, repair = model.requests
    assert repair["messages"][: len(first["messages"])] == first["messages"]
    assert repair["messages"][-2] == {"role": "assistant", "content": garbage}
    assert repair["messages"][-1]["role"] == "user"
    assert "could not be read as JSON" in repair["messages"][-1]["content"]
    assert repair["response_format"]["type"] in JSON_FORMATS
    assert candidate.update == {"prompt": "Repaired."}
    assert candidate.repaired is True and candidate.error is None
    assert candidate.prompt_messages == repair["messages"]


async def test_garbage_twice_gives_an_error_candidate_with_no_update():
    model = ScriptedModel(["no json here", "still none, sorry", reply({"k": 9})])
    [candidate] = await Aggregator(model).aggregate(params(), [proposal({"k": 4})], stepsize=0.5)
    assert len(model.requests) == 2  # only one repair request
    assert model.remaining == 1
    assert candidate.update == {}
    assert candidate.error and "no suggestion could be extracted" in candidate.error
    assert candidate.repaired is True
    assert candidate.raw_response == "still none, sorry"


async def test_truncated_reply_is_repaired_even_if_it_parses():
    cut = Completion(texts=['{"suggestion": {"prompt": "A long prompt that was cu'], finish_reason="length")
    model = ScriptedModel([cut, reply({"prompt": "Short."})])
    [candidate] = await Aggregator(model).aggregate(params(), [proposal({"prompt": "X."})], stepsize=0.5)
    assert len(model.requests) == 2
    repair = model.requests[1]["messages"]
    assert repair[-2]["content"] == cut.text
    assert "cut off at the length limit" in repair[-1]["content"]
    assert candidate.update == {"prompt": "Short."} and candidate.repaired is True


async def test_truncated_twice_never_applies_a_cut_value():
    cut = Completion(texts=['{"suggestion": {"k": 7, "prompt": "half'], finish_reason="length")
    model = ScriptedModel([cut, cut])
    [candidate] = await Aggregator(model).aggregate(params(), [proposal({"k": 7})], stepsize=0.5)
    assert candidate.update == {}
    assert candidate.error and "truncated" in candidate.error


async def test_llm_error_propagates_to_the_caller():
    model = ScriptedModel([LLMError("backend down")])
    with pytest.raises(LLMError, match="backend down"):
        await Aggregator(model).aggregate(params(), [proposal({"k": 4})], stepsize=0.5)


async def test_wrong_type_value_is_skipped_and_recorded():
    model = ScriptedModel([json.dumps({"suggestion": {"k": "many", "prompt": "New.", "style": "x", "zzz": 1}})])
    [candidate] = await Aggregator(model).aggregate(params(), [proposal({"k": 4})], stepsize=0.5)
    assert candidate.update == {"prompt": "New."}
    skipped = {item["name"]: item for item in candidate.skipped}
    assert set(skipped) == {"k", "style", "zzz"}
    assert skipped["k"]["value"] == "many" and "int" in skipped["k"]["reason"]
    assert skipped["style"]["reason"]  # fixed parameters are never merged
    assert "not a parameter" in skipped["zzz"]["reason"]


async def test_values_breaking_a_constraint_are_skipped():
    model = ScriptedModel([reply({"k": 50, "prompt": "New."})])
    [candidate] = await Aggregator(model).aggregate(params(), [proposal({"k": 4})], stepsize=0.5)
    assert candidate.update == {"prompt": "New."}
    assert [s["name"] for s in candidate.skipped] == ["k"]
    assert "maximum" in candidate.skipped[0]["reason"]


async def test_numeric_text_is_coerced_to_the_parameter_type():
    model = ScriptedModel([reply({"k": "6"})])
    [candidate] = await Aggregator(model).aggregate(params(), [proposal({"k": 4})], stepsize=0.5)
    assert candidate.update == {"k": 6} and candidate.skipped == []


# ----------------------------------------------------------------------- samples


async def test_num_candidates_asks_for_n_samples_in_one_call():
    model = ScriptedModel([reply({"k": 4}), reply({"k": 6})])
    candidates = await Aggregator(model, num_candidates=2).aggregate(
        params(), [proposal({"k": 4}), proposal({"k": 6})], stepsize=0.5
    )
    assert len(model.requests) == 1 and model.requests[0]["n"] == 2
    assert [c.update for c in candidates] == [{"k": 4}, {"k": 6}]
    assert [c.sample_index for c in candidates] == [0, 1]
    assert candidates[0].candidate_id != candidates[1].candidate_id


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="fan_in"):
        Aggregator(ScriptedModel([]), fan_in=1)
    with pytest.raises(ValueError, match="num_candidates"):
        Aggregator(ScriptedModel([]), num_candidates=0)


# ----------------------------------------------------------------------- grouping


def merging_model():
    """Replies with the largest k named in the suggestions' reasoning (suggestion 0 excluded)."""

    def respond(messages):
        text = messages[-1]["content"]
        ks = [int(k) for k in re.findall(r"^Reasoning: k=(\d+)$", text, re.MULTILINE)]
        return reply({"k": max(ks)}, reasoning=f"k={max(ks)}")

    return ScriptedModel(respond)


async def test_fan_in_bounds_every_prompt_and_merges_in_groups():
    model = merging_model()
    proposals = [proposal({"k": k}, f"k={k}") for k in (4, 5, 6, 7, 8)]
    [final] = await Aggregator(model, fan_in=2).aggregate(params(), proposals, stepsize=0.5)
    assert len(model.requests) > 1
    for request in model.requests:
        assert 1 <= len(suggestions_in(request)) <= 2, user_text(request)
    assert final.update == {"k": 8}
    assert final.groups and all(g.level < final.level for g in final.groups)
    assert sorted(final.source_proposals) == sorted(p.proposal_id for p in proposals)


async def test_fan_in_with_an_even_number_of_proposals():
    model = merging_model()
    proposals = [proposal({"k": k}, f"k={k}") for k in (2, 9, 4, 5)]
    [final] = await Aggregator(model, fan_in=2).aggregate(params(), proposals, stepsize=0.5)
    assert [len(suggestions_in(r)) for r in model.requests] == [2, 2, 2]
    assert final.update == {"k": 9} and final.level == 2
    assert len(final.groups) == 2


async def test_max_prompt_tokens_forces_groups():
    long_text = "word " * 200
    proposals = [proposal({"prompt": f"{i} {long_text}", "k": 2 + i}) for i in range(4)]

    probe = Aggregator(ScriptedModel([]))
    from opto.search.aggregation import dedupe  # the same suggestions the aggregator builds

    suggestions = dedupe(proposals)
    two = probe._prompt_tokens([p for p in params() if p.trainable], suggestions[:2], 0.5)
    three = probe._prompt_tokens([p for p in params() if p.trainable], suggestions[:3], 0.5)
    limit = (two + three) // 2
    assert two <= limit < three

    model = ScriptedModel(lambda messages: reply({"k": 7}))
    aggregator = Aggregator(model, max_prompt_tokens=limit, fan_in=8)
    [final] = await aggregator.aggregate(params(), proposals, stepsize=0.5)
    assert len(model.requests) == 3  # two groups of two, then the final merge
    for request in model.requests:
        tokens = sum(len(m["content"]) // 4 for m in request["messages"])
        assert tokens <= limit
    assert final.update == {"k": 7}
    assert len(final.groups) == 2


async def test_groups_that_yield_no_update_are_dropped():
    def respond(messages):
        return "TERMINATE"

    model = ScriptedModel(respond)
    proposals = [proposal({"k": k}) for k in (4, 5, 6, 7)]
    assert await Aggregator(model, fan_in=2).aggregate(params(), proposals, stepsize=0.5) == []
    assert len(model.requests) == 2  # both groups asked, no final merge


async def test_a_step_merges_in_one_call_whenever_the_prompt_fits():
    model = merging_model()
    proposals = [proposal({"k": 1 + i % 10, "prompt": f"Variant {i}."}, reasoning=f"k={1 + i % 10}")
                 for i in range(32)]
    [final] = await Aggregator(model).aggregate(params(), proposals, stepsize=0.5)
    assert len(model.requests) == 1  # 32 short suggestions: one prompt, no group rounds
    assert final.level == 1 and final.groups == [] and len(final.source_proposals) == 32
    assert final.update == {"k": 10}
