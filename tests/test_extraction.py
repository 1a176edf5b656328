"""Tests for opto.extraction: reading suggestions from replies and checking updates."""

from __future__ import annotations

import logging

import json_repair
import pytest

from opto.extraction import (
    EXTRACTION_METHODS,
    Extraction,
    ExtractionError,
    SkippedValue,
    UpdateError,
    UpdateResult,
    construct_update,
    construct_update_dict,
    extract_llm_suggestion,
    extract_with_method,
)
from opto.core.parameters import Constraint, Parameter

# ------------------------------------------------------------- one test per strategy


def test_strict_json() -> None:
    reply = ' \n{"reasoning": "too vague", "suggestion": {"prompt": "Be precise.", "k": 3}}\n '
    result = extract_with_method(reply)
    assert result == Extraction({"prompt": "Be precise.", "k": 3}, "json", False)


def test_fenced_block_tries_each_fence() -> None:
    reply = (
        "First the code I ran:\n```python\nprint({'not': 'json'})\n```\n"
        "Then my answer:\n```json\n"
        '{"reasoning": "r", "suggestion": {"prompt": "Think step by step.", "use_cot": true}}\n'
        "```\nHope that helps."
    )
    result = extract_with_method(reply)
    assert result.method == "fenced"
    assert result.suggestion == {"prompt": "Think step by step.", "use_cot": True}


def test_fenced_block_without_language_tag() -> None:
    reply = 'Answer:\n```\n{"suggestion": {"temperature": 0.5}}\n```'
    assert extract_with_method(reply) == Extraction({"temperature": 0.5}, "fenced", False)


def test_balanced_scan_skips_braces_and_escaped_quotes_inside_strings() -> None:
    reply = (
        "Use the {name} placeholder as before. My update is "
        '{"reasoning": "the template {x} had a stray } and a \\"quoted {\\" word", '
        '"suggestion": {"prompt": "Fill {name} in; never print \\"}\\" alone."}} '
        "and that is all {"
    )
    result = extract_with_method(reply)
    assert result.method == "balanced"
    assert result.suggestion == {"prompt": 'Fill {name} in; never print "}" alone.'}


def test_balanced_scan_prefers_a_candidate_with_a_suggestion_over_an_empty_one() -> None:
    reply = 'If nothing changes I send {}. This time: {"suggestion": {"k": 2}}'
    assert extract_with_method(reply) == Extraction({"k": 2}, "balanced", False)


def test_python_literal_is_read_exactly() -> None:
    reply = (
        "Here's my update: {'reasoning': 'too long', 'suggestion': "
        "{'prompt': '''Line one\nLine 'two' ''', 'pattern': r'\\d+', 'use_cot': True, 'stop': None}}"
    )
    result = extract_with_method(reply)
    assert result.method == "python_literal"
    assert result.suggestion == {
        "prompt": "Line one\nLine 'two' ",
        "pattern": "\\d+",
        "use_cot": True,
        "stop": None,
    }
    # json_repair alone would have guessed wrongly: why literals are tried first.
    start = reply.index("{")
    assert json_repair.loads(reply[start:]).get("suggestion") != result.suggestion


def test_python_literal_tuples_become_lists() -> None:
    reply = "{'suggestion': {'stops': ('a', 'b'), 'weights': {1: 0.5}}}"
    result = extract_with_method(reply)
    assert result.method == "python_literal"
    assert result.suggestion == {"stops": ["a", "b"], "weights": {"1": 0.5}}


def test_json_repair_fixes_a_complete_but_broken_object() -> None:
    reply = 'Update:\n{suggestion: {prompt: "Be brief", // shorter is better\n k: 3,}}'
    result = extract_with_method(reply)
    assert result.method == "json_repair"
    assert result.suggestion == {"prompt": "Be brief", "k": 3}


def test_key_scan_on_a_truncated_reply() -> None:
    reply = '{"suggestion": {"prompt": "Count each item", "k": 3, "temperature": 0.'
    result = extract_with_method(reply)
    assert result == Extraction({"prompt": "Count each item", "k": 3}, "key_scan", False)


def test_key_scan_keeps_neighbours_apart_and_reads_every_value_kind() -> None:
    reply = (
        "Here's the fix, I don't think it needs more: "
        '{"reasoning": "the old \\"prompt\\": was vague, k: 2", "suggestion": {'
        '"prompt": "Count each item,\nthen add them up", "use_cot": true, "strict": False, '
        '"examples": ["a, b", "c\\"]"], "k": -3, "scale": 2.5e-1, "stop": null, '
        "'style': 'it\\'s terse', \"note\": \"cut off here"
    )
    result = extract_with_method(reply)
    assert result.method == "key_scan"
    assert result.suggestion == {
        "prompt": "Count each item,\nthen add them up",
        "use_cot": True,
        "strict": False,
        "examples": ["a, b", 'c"]'],
        "k": -3,
        "scale": 0.25,
        "stop": None,
        "style": "it's terse",
    }


def test_key_scan_drops_a_truncated_list_and_keeps_what_came_before() -> None:
    reply = '{"suggestion": {"prompt": "p", "examples": ["one", "tw'
    assert extract_with_method(reply) == Extraction({"prompt": "p"}, "key_scan", False)


def test_key_scan_keeps_an_unescaped_quote_inside_a_value() -> None:
    reply = '{"suggestion": {"prompt": "Use 5" screens", "k": 4, "t": 1'
    assert extract_with_method(reply) == Extraction({"prompt": 'Use 5" screens', "k": 4}, "key_scan", False)


def test_key_scan_reads_objects_and_enters_cut_off_ones() -> None:
    reply = (
        '{"new_values": {"prompt": "Say \\"caf\\u00e9\\" twice", "config": {"a": [1, 2]}, '
        '"k": 3, "t": 0.'
    )
    result = extract_with_method(reply)
    assert result.method == "key_scan"
    assert result.suggestion == {"prompt": 'Say "caf\u00e9" twice', "config": {"a": [1, 2]}, "k": 3}


def test_objects_inside_a_cut_off_reply_are_not_taken_for_the_reply() -> None:
    reply = (
        'My answer: {"suggestion": {"prompt": "Solve it", "examples": [{"q": "1+1", "a": "2"}, '
        '{"q": "2+2", "a": "4"}], "settings": {"depth": 2}, "k": 3, "t": 0.'
    )
    result = extract_with_method(reply)
    assert result.method == "key_scan"
    assert result.suggestion == {
        "prompt": "Solve it",
        "examples": [{"q": "1+1", "a": "2"}, {"q": "2+2", "a": "4"}],
        "settings": {"depth": 2},
        "k": 3,
    }


def test_a_reply_after_a_stray_brace_in_prose_is_still_found() -> None:
    reply = 'Careful with { in prompts. Answer: {"suggestion": {"k": 4}}'
    assert extract_with_method(reply) == Extraction({"k": 4}, "balanced", False)


def test_a_reply_wrapped_in_a_list_is_found() -> None:
    reply = '[{"reasoning": "r", "suggestion": {"k": 4}}]'
    assert extract_with_method(reply) == Extraction({"k": 4}, "balanced", False)


def test_key_scan_ignores_apostrophes_in_prose() -> None:
    reply = 'Here\'s my fix: {"suggestion": {"prompt": "Don\'t stop", "k": 2, "t": 0.'
    assert extract_with_method(reply) == Extraction({"prompt": "Don't stop", "k": 2}, "key_scan", False)


def test_json_repair_needs_a_colon_to_invent_a_pair() -> None:
    # json_repair alone reads this as {"prompt": "as is"}: a value nobody suggested.
    reply = 'Keep {"prompt" "as is"} please.'
    assert json_repair.loads(reply[reply.index("{") : reply.index("}") + 1]) == {"prompt": "as is"}
    assert extract_with_method(reply).failed


def test_methods_are_listed_in_order() -> None:
    assert EXTRACTION_METHODS == ("json", "fenced", "balanced", "python_literal", "json_repair", "yaml", "key_scan")


# ----------------------------------------------------------------------- reply shapes


def test_multi_line_strings_raw_and_escaped() -> None:
    raw = '{"suggestion": {"prompt": "Step 1: read.\nStep 2: answer."}}'
    escaped = '{"suggestion": {"prompt": "Step 1: read.\\nStep 2: answer."}}'
    for reply in (raw, escaped):
        result = extract_with_method(reply)
        assert result.method == "json"
        assert result.suggestion == {"prompt": "Step 1: read.\nStep 2: answer."}


def test_top_level_keys_drop_bookkeeping() -> None:
    reply = (
        '{"reasoning": "r", "reasoning_steps": ["a"], "answer": "x", "explanation": "e", '
        '"thoughts": "t", "prompt": "New prompt", "k": 5}'
    )
    assert extract_llm_suggestion(reply) == {"prompt": "New prompt", "k": 5}


def test_suggestion_key_wins_over_top_level_keys() -> None:
    reply = '{"reasoning": "r", "prompt": "top level", "suggestion": {"prompt": "nested"}}'
    assert extract_llm_suggestion(reply) == {"prompt": "nested"}


@pytest.mark.parametrize("key", ["suggestion", "suggestions", "update"])
def test_suggestion_wrapper_names(key: str) -> None:
    reply = f'{{"reasoning": "r", "{key}": {{"k": 7}}}}'
    assert extract_llm_suggestion(reply) == {"k": 7}


def test_suggestion_given_as_json_text() -> None:
    reply = '{"suggestion": "{\\"k\\": 2}"}'
    assert extract_with_method(reply) == Extraction({"k": 2}, "json", False)


def test_suggestion_given_as_prose_is_a_failure_not_no_change() -> None:
    result = extract_with_method('{"suggestion": "make the prompt shorter"}')
    assert result.failed
    assert result.terminate is False and result.method is None


# --------------------------------------------------------------------------- TERMINATE


@pytest.mark.parametrize("reply", ["TERMINATE", "  TERMINATE\n", '"TERMINATE"', "'TERMINATE.'", "**TERMINATE**", "terminate!"])
def test_bare_terminate_means_no_change(reply: str) -> None:
    result = extract_with_method(reply)
    assert result == Extraction({}, None, True)
    assert not result.failed
    assert extract_llm_suggestion(reply, ignore_extraction_error=False) == {}


def test_terminate_inside_a_value_is_a_value() -> None:
    reply = '{"suggestion": {"prompt": "Work, then reply TERMINATE when done."}}'
    result = extract_with_method(reply)
    assert result.terminate is False
    assert result.suggestion == {"prompt": "Work, then reply TERMINATE when done."}


def test_terminate_after_prose_is_not_bare() -> None:
    assert extract_with_method("I looked at it. TERMINATE, or maybe not").failed


@pytest.mark.parametrize(
    "reply",
    [
        '{"suggestion": "TERMINATE"}',
        '{"reasoning": "all good", "suggestion": {}}',
        '{"reasoning": "all good", "suggestion": null}',
        '{"reasoning": "all good", "suggestion": []}',
        '{"reasoning": "all good", "answer": "TERMINATE"}',
        "```json\n{\"suggestion\": {}}\n```",
    ],
)
def test_empty_suggestion_means_no_change(reply: str) -> None:
    result = extract_with_method(reply)
    assert result.suggestion == {}
    assert result.terminate is True
    assert result.method in {"json", "fenced"}
    assert extract_llm_suggestion(reply, ignore_extraction_error=False) == {}


# ------------------------------------------------------------------------ failures


@pytest.mark.parametrize("reply", ["I would rather not say.", "", "[1, 2, 3]", "{name} and {x}"])
def test_garbage_is_a_failure(reply: str) -> None:
    result = extract_with_method(reply)
    assert result == Extraction({}, None, False)
    assert result.failed


def test_garbage_with_ignore_returns_empty_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="opto.extraction"):
        assert extract_llm_suggestion("no json at all") == {}
    assert "no json at all" in caplog.text


def test_garbage_without_ignore_raises_with_excerpt() -> None:
    reply = "nothing useful " + "x" * 500
    with pytest.raises(ExtractionError) as info:
        extract_llm_suggestion(reply, ignore_extraction_error=False)
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert "nothing useful" in message
    assert "x" * 100 in message and "x" * 300 not in message
    assert info.value.response == reply


# ------------------------------------------------------------------------ coercion


def _one(initial, value, **kwargs) -> UpdateResult:
    return construct_update({"p": Parameter(initial, name="p", **kwargs)}, {"p": value})


@pytest.mark.parametrize(
    ("initial", "value", "expected"),
    [
        (False, True, True),
        (True, "False", False),
        (False, "yes", True),
        (True, "NO", False),
        (False, " 1 ", True),
        (True, "0", False),
        (False, 1, True),
        (True, 0, False),
        (0, 4, 4),
        (0, 4.0, 4),
        (0, "4", 4),
        (0, "4.0", 4),
        (0, " 7 ", 7),
        (0, "-12", -12),
        (0.0, 3, 3.0),
        (0.0, "0.25", 0.25),
        (0.0, " 1e-3 ", 0.001),
        ("old", "new", "new"),
        ("old", 3, "3"),
        ("old", 0.5, "0.5"),
        ("old", True, "true"),
        ("old", ["a", "b"], '["a", "b"]'),
        ("old", {"a": 1}, '{"a": 1}'),
        ([], [3, 4], [3, 4]),
        ([], "[3, 4]", [3, 4]),
        ([], "['a', 'b']", ["a", "b"]),
        ({}, {"a": 1}, {"a": 1}),
        ({}, '{"a": 1}', {"a": 1}),
        ({}, "{'a': True}", {"a": True}),
    ],
)
def test_coercion_accepts(initial, value, expected) -> None:
    result = _one(initial, value)
    assert result.skipped == []
    assert result.update == {"p": expected}
    assert type(result.update["p"]) is type(expected)


@pytest.mark.parametrize(
    ("initial", "value", "reason_part"),
    [
        (False, "maybe", "bool"),
        (False, 2, "bool"),
        (0, 4.5, "whole number"),
        (0, "4.5", "whole number"),
        (0, True, "bool"),
        (0, "four", "int"),
        (0.0, "abc", "number"),
        (0.0, False, "bool"),
        (0.0, "nan", "finite"),
        ([], "a, b", "list"),
        ([], {"a": 1}, "list"),
        ({}, "[1]", "dict"),
        ({}, 3, "dict"),
        ("old", None, "None"),
        (0, None, "None"),
    ],
)
def test_coercion_rejects(initial, value, reason_part) -> None:
    result = _one(initial, value)
    assert result.update == {}
    assert len(result.skipped) == 1
    skipped = result.skipped[0]
    assert (skipped.name, skipped.value) == ("p", value)
    assert reason_part in skipped.reason


def test_constraint_violation_is_skipped_with_the_reason() -> None:
    params = {
        "mode": Parameter("short", name="mode", constraint=Constraint(choices=("short", "long"))),
        "k": Parameter(3, name="k", constraint=Constraint(min=1, max=10)),
    }
    result = construct_update(params, {"mode": "medium", "k": "12"})
    assert result.update == {}
    reasons = {item.name: item.reason for item in result.skipped}
    assert "not one of" in reasons["mode"]
    assert "above the maximum" in reasons["k"]


def test_unknown_and_non_trainable_are_skipped(caplog: pytest.LogCaptureFixture) -> None:
    params = [Parameter("a", name="prompt"), Parameter("fixed", name="system", trainable=False)]
    with caplog.at_level(logging.WARNING, logger="opto.extraction"):
        result = construct_update(params, {"prompt": "b", "system": "new", "tempreature": 0.2})
    assert result.update == {"prompt": "b"}
    assert result.skipped == [
        SkippedValue("system", "new", "the parameter is not trainable"),
        SkippedValue("tempreature", 0.2, "not a parameter name"),
    ]
    assert "tempreature" in caplog.text and "system" in caplog.text


def test_unchanged_values_are_dropped_silently() -> None:
    params = {
        "k": Parameter(4, name="k"),
        "flags": Parameter({"a": 1}, name="flags"),
        "prompt": Parameter("same", name="prompt"),
    }
    result = construct_update(params, {"k": "4.0", "flags": {"a": True}, "prompt": "same"})
    assert result.skipped == []
    # {"a": True} is not the stored {"a": 1}: the type changed, so it is an update.
    assert result.update == {"flags": {"a": True}}


def test_unchanged_compares_stored_value_not_assigned_override() -> None:
    from opto.core.parameters import assign

    param = Parameter("stored", name="prompt")
    with assign({param: "override"}):
        assert construct_update_dict([param], {"prompt": "stored"}) == {}
        assert construct_update_dict([param], {"prompt": "override"}) == {"prompt": "override"}


def test_update_dict_ignores_or_raises() -> None:
    params = {"k": Parameter(3, name="k"), "prompt": Parameter("a", name="prompt")}
    suggestion = {"prompt": "b", "k": "x" * 300}
    assert construct_update_dict(params, suggestion) == {"prompt": "b"}
    with pytest.raises(UpdateError) as info:
        construct_update_dict(params, suggestion, ignore_extraction_error=False)
    error = info.value
    assert isinstance(error, ValueError)
    assert error.name == "k" and error.value == "x" * 300
    message = str(error)
    assert "'k'" in message and "int" in message
    assert "xxxxxxxx" in message and "x" * 300 not in message


def test_update_dict_raises_for_unknown_names_when_strict() -> None:
    with pytest.raises(UpdateError, match="not a parameter name"):
        construct_update_dict([Parameter(1, name="k")], {"q": 2}, ignore_extraction_error=False)


def test_strict_update_with_only_good_values_returns_them() -> None:
    params = [Parameter(1, name="k"), Parameter(True, name="flag")]
    assert construct_update_dict(params, {"k": "2", "flag": "no"}, ignore_extraction_error=False) == {
        "k": 2,
        "flag": False,
    }


def test_parameters_need_unique_names() -> None:
    with pytest.raises(ValueError, match="no name"):
        construct_update([Parameter(1)], {"k": 2})
    with pytest.raises(ValueError, match="two parameters"):
        construct_update([Parameter(1, name="k"), Parameter(2, name="k")], {"k": 3})


def test_extract_then_construct_end_to_end() -> None:
    params = [
        Parameter("Answer.", name="prompt"),
        Parameter(1, name="k", constraint=Constraint(max=5)),
        Parameter(False, name="use_cot"),
    ]
    reply = '{"reasoning": "r", "suggestion": {"prompt": "Answer briefly.", "k": "9", "use_cot": "true", "temperature": 0.'
    extraction = extract_with_method(reply)
    assert extraction.method == "key_scan"
    result = construct_update(params, extraction.suggestion)
    assert result.update == {"prompt": "Answer briefly.", "use_cot": True}
    assert [item.name for item in result.skipped] == ["k"]
