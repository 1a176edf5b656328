"""Hostile replies never crash extraction, and what it returns can always be stored.

Hypothesis generates replies from random text, JSON-like structures (deep nesting,
lone surrogates, huge numbers, NaN and Infinity tokens, wrapper keys) and truncations
of both; extraction and coercion must never raise with `ignore_extraction_error=True`,
and every value they return must be written to a ledger and read back unchanged.
"""

import contextlib
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opto import Parameter, construct_update_dict, extract_llm_suggestion
from opto._util.files import to_json_line
from opto._util import redaction
from opto.extraction import extract_with_method

# OPTO_FUZZ_EXAMPLES sets how many replies hypothesis generates: CI runs the default,
# which keeps it within its 12 minutes; 10000 takes about a minute on one core.
EXAMPLES = int(os.environ.get("OPTO_FUZZ_EXAMPLES", "2000"))

PARAMETERS = [
    Parameter("Answer.", name="prompt"),
    Parameter(3, name="k"),
    Parameter(0.5, name="temperature"),
    Parameter(True, name="verbose"),
    Parameter(["a"], name="tags"),
    Parameter({"x": 1}, name="config"),
]
NAMES = [p.name for p in PARAMETERS]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30), st.sampled_from(["\ud83d", "a\udfffb", "TERMINATE", "NaN", "Infinity", "1" * 5000]),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=8) | st.sampled_from(NAMES), inner, max_size=4), max_leaves=20)
suggestions = st.dictionaries(st.sampled_from(NAMES) | st.text(max_size=10), values, max_size=4)
wrappers = st.sampled_from(["suggestion", "suggestions", "update", "response", "output", "result"])


@st.composite
def replies(draw):
    kind = draw(st.integers(0, 6))
    suggestion = draw(suggestions)
    if kind == 0:
        text = draw(st.text(max_size=200))
    elif kind == 1:
        text = json.dumps({"reasoning": draw(st.text(max_size=20)), "suggestion": suggestion}, allow_nan=True)
    elif kind == 2:
        text = json.dumps({draw(wrappers): {"reasoning": "r", "suggestion": suggestion}}, allow_nan=True)
    elif kind == 3:
        depth = draw(st.integers(1, 1500))
        text = '{"suggestion": {"prompt": ' + "[" * depth + "1" + "]" * draw(st.integers(0, depth)) + "}}"
    elif kind == 4:
        text = "```json\n" + json.dumps({"suggestion": suggestion}, allow_nan=True) + "\n```"
    elif kind == 5:
        lines = [f"  {k}: {json.dumps(v, allow_nan=True)}" for k, v in suggestion.items()]
        text = "Here you go.\nsuggestion:\n" + "\n".join(lines) + "\n"
    else:
        text = "'prompt': " + repr(draw(values)) + ", \"k\": " + draw(st.sampled_from(["1" * 5000, "NaN", "-Infinity"]))
    if draw(st.booleans()):
        text = text[: draw(st.integers(0, len(text)))]  # cut off, as at max_tokens
    return text


def _round_trips(tmp_path, value):
    """Encoded exactly as the ledger writer encodes a record (UTF-8 JSON text), read back."""
    text = to_json_line({"value": value})
    return json.loads(text.encode("utf-8").decode("utf-8")) == {"value": value}


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])
@given(reply=replies())
def test_hostile_replies_never_raise_and_everything_returned_can_be_stored(tmp_path, reply):
    # Keys other tests used (e.g. "test-key") are redacted from whatever is written, by
    # design; Hypothesis draws such literals from the source, so none is remembered here.
    with _no_remembered_secrets():
        _check_round_trips(tmp_path, reply)


@contextlib.contextmanager
def _no_remembered_secrets():
    saved = redaction._secrets
    redaction._secrets = ()
    try:
        yield
    finally:
        redaction._secrets = saved


def _check_round_trips(tmp_path, reply):
    suggestion = extract_llm_suggestion(reply)
    update = construct_update_dict(PARAMETERS, suggestion)
    extraction = extract_with_method(reply)
    assert _round_trips(tmp_path, suggestion)
    assert _round_trips(tmp_path, update)
    assert _round_trips(tmp_path, [s.__dict__ for s in extraction.skipped])
    for name, value in update.items():
        assert next(p for p in PARAMETERS if p.name == name).validate(value) == value


# ----------------------------------------------------------- the classes found before


@pytest.mark.parametrize("reply", [
    '{"suggestion": {"prompt": "a \\ud83d b"}}',
    '{"suggestion": {"prompt": ' + "[" * 500 + "]" * 500 + "}}",
    '{"suggestion": {"prompt": ' + "[" * 5000 + "]" * 5000 + "}}",
    '"k": ' + "7" * 5000 + ', "prompt": "ok"',
    '{"suggestion": {"tags": [NaN, 1], "temperature": Infinity, "prompt": "kept"}}',
])
def test_each_class_of_crash_found_before_is_handled(tmp_path, reply):
    extraction = extract_with_method(reply)
    update = construct_update_dict(PARAMETERS, extract_llm_suggestion(reply))
    assert _round_trips(tmp_path, extraction.suggestion) and _round_trips(tmp_path, update)
    assert "\ud83d" not in json.dumps(extraction.suggestion, ensure_ascii=False, default=str).encode(
        "utf-8", "surrogatepass").decode("utf-8", "replace")


def test_a_lone_surrogate_becomes_the_replacement_character():
    assert extract_llm_suggestion('{"suggestion": {"prompt": "a \\ud83d b"}}') == {"prompt": "a \ufffd b"}


def test_non_finite_values_are_skipped_with_the_reason():
    extraction = extract_with_method('{"suggestion": {"tags": [NaN], "temperature": Infinity, "prompt": "kept"}}')
    assert extraction.suggestion == {"prompt": "kept"}
    reasons = {s.name: s.reason for s in extraction.skipped}
    assert reasons == {"tags": "nan is not a finite number", "temperature": "inf is not a finite number"}


def test_a_huge_number_does_not_crash_the_key_scan():
    extraction = extract_with_method('"k": ' + "7" * 5000 + ', "prompt": "ok"')
    assert extraction.suggestion == {"prompt": "ok"} and extraction.method == "key_scan"
    assert extraction.skipped[0].name == "k"


@pytest.mark.parametrize("wrapper", ["response", "output", "result"])
def test_a_reply_wrapped_in_one_more_object_is_read(wrapper):
    reply = json.dumps({wrapper: {"reasoning": "shorter", "suggestion": {"prompt": "Be brief."}}})
    assert extract_llm_suggestion(reply) == {"prompt": "Be brief."}
    assert extract_llm_suggestion(json.dumps({wrapper: {"prompt": "Be brief."}})) == {"prompt": "Be brief."}


def test_yaml_style_replies_are_read():
    reply = "Reasoning: be brief.\nsuggestion:\n  prompt: Be brief.\n  k: 4\n  tags: [a, b]\n"
    extraction = extract_with_method(reply)
    assert extraction.method == "yaml"
    assert extraction.suggestion == {"prompt": "Be brief.", "k": 4, "tags": ["a", "b"]}


def test_yaml_aliases_are_not_expanded():
    bomb = "suggestion:\n  a: &a [x, x, x, x, x, x, x, x, x]\n  b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n" \
           "  c: [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
    assert extract_with_method(bomb).method != "yaml"
