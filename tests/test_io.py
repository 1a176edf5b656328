"""Crash-safe JSON files: every value a run may hold is written and read back unchanged."""

import json

import pytest

from opto._util.files import append_jsonl, atomic_write_json, read_jsonl, repair_jsonl


@pytest.mark.parametrize("value", [
    "a lone surrogate \ud83d in a reply",
    "line\u2028separator and next\u0085line and \r carriage return",
    "emoji \U0001F600 and accents é",
    {"nested": ["\udfff", {"k": "\ud800x"}]},
])
def test_a_record_is_read_back_exactly(tmp_path, value):
    path = tmp_path / "ledger.jsonl"
    append_jsonl(path, [{"step": 1, "value": value}, {"step": 2, "value": "plain"}])
    assert read_jsonl(path) == [{"step": 1, "value": value}, {"step": 2, "value": "plain"}]
    atomic_write_json(tmp_path / "c.json", {"value": value})
    assert json.loads((tmp_path / "c.json").read_text(encoding="utf-8")) == {"value": value}


def test_plain_text_stays_readable(tmp_path):
    path = tmp_path / "ledger.jsonl"
    append_jsonl(path, [{"text": "café \U0001F600"}])
    assert "café \U0001F600" in path.read_text(encoding="utf-8")


def test_an_append_after_a_torn_line_does_not_glue_onto_it(tmp_path):
    path = tmp_path / "ledger.jsonl"
    append_jsonl(path, [{"a": 1}])
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"b": 2, "tor')  # a crash in the middle of an append
    append_jsonl(path, [{"c": 3}])
    assert path.read_text(encoding="utf-8") == '{"a": 1}\n{"c": 3}\n'


def test_a_whole_record_without_its_newline_is_kept(tmp_path):
    path = tmp_path / "ledger.jsonl"
    path.write_text('{"a": 1}\n{"b": 2}', encoding="utf-8")
    assert read_jsonl(path) == [{"a": 1}, {"b": 2}]
    assert repair_jsonl(path) is True
    append_jsonl(path, [{"c": 3}])
    assert read_jsonl(path) == [{"a": 1}, {"b": 2}, {"c": 3}]


def test_repair_leaves_whole_files_and_missing_files_alone(tmp_path):
    path = tmp_path / "ledger.jsonl"
    assert repair_jsonl(path) is False
    path.write_text('{"a": 1}\n', encoding="utf-8")
    assert repair_jsonl(path) is False and path.read_text(encoding="utf-8") == '{"a": 1}\n'
    path.write_text('{"a"', encoding="utf-8")  # a torn first line
    assert repair_jsonl(path) is True and path.read_text(encoding="utf-8") == ""


def test_a_corrupt_line_in_the_middle_is_an_error_naming_it(tmp_path):
    path = tmp_path / "ledger.jsonl"
    path.write_text('{"a": 1}\nnot json\n{"b": 2}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="ledger.jsonl:2 is not valid JSON"):
        read_jsonl(path)
