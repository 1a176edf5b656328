"""Tests of opto.core.data: dataset shapes, row errors and the resumable DataLoader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opto.core.data import DataLoader, DatasetError, Example, load_dataset

# --- Example ---------------------------------------------------------------------------


def test_example_positional_and_keyword_construction() -> None:
    assert Example("q", "a", "e1") == Example(x="q", info="a", id="e1")
    example = Example("q")
    assert (example.x, example.info, example.id) == ("q", None, None)


def test_example_rejects_unknown_fields() -> None:
    with pytest.raises(ValueError, match="label"):
        Example("q", label="a")


# --- accepted shapes -------------------------------------------------------------------


def _triples(examples: list[Example]) -> list[tuple[object, object, str | None]]:
    return [(e.x, e.info, e.id) for e in examples]


EXPECTED = [("2+2", "4", "0"), ("3+3", "6", "1")]


def test_list_of_examples_keeps_given_ids_and_fills_missing() -> None:
    examples = load_dataset([Example("2+2", "4"), Example("3+3", "6", id="b")])
    assert _triples(examples) == [("2+2", "4", "0"), ("3+3", "6", "b")]


def test_list_of_pairs_tuples_and_lists() -> None:
    assert _triples(load_dataset([("2+2", "4"), ["3+3", "6"]])) == EXPECTED


def test_list_of_dicts_with_optional_info_and_id() -> None:
    examples = load_dataset([{"x": "2+2", "info": "4"}, {"x": "3+3", "id": "q2"}, {"x": "1+1", "id": 7}])
    assert _triples(examples) == [("2+2", "4", "0"), ("3+3", None, "q2"), ("1+1", None, "7")]


def test_trace_style_dict() -> None:
    assert _triples(load_dataset({"inputs": ["2+2", "3+3"], "infos": ["4", "6"]})) == EXPECTED


def test_jsonl_path_as_str_and_path_skips_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text('{"x": "2+2", "info": "4"}\n\n   \n{"x": "3+3", "info": "6"}\n', encoding="utf-8")
    assert _triples(load_dataset(path)) == EXPECTED
    assert _triples(load_dataset(str(path))) == EXPECTED


def test_structured_values_are_kept() -> None:
    (example,) = load_dataset([{"x": {"question": "q", "context": [1, 2]}, "info": ["three", "3"]}])
    assert example.x == {"question": "q", "context": [1, 2]}
    assert example.info == ["three", "3"]


# --- malformed rows --------------------------------------------------------------------


def test_missing_x_names_the_row() -> None:
    with pytest.raises(DatasetError, match=r"row 1 has no 'x' key \(rename 'input' to 'x'\)"):
        load_dataset([{"x": "a"}, {"input": "b", "info": "c"}])


def test_unexpected_row_keys_are_named() -> None:
    with pytest.raises(DatasetError, match=r"row 0 has unexpected keys \['answer'\]"):
        load_dataset([{"x": "a", "answer": "b"}])


def test_wrong_pair_length_names_the_row_and_count() -> None:
    with pytest.raises(DatasetError, match=r"row 2 is a tuple of 3 items.*exactly 2 items"):
        load_dataset([("a", "b"), ("c", "d"), ("e", "f", "g")])


def test_unsupported_row_type() -> None:
    with pytest.raises(DatasetError, match=r"row 0 is a str"):
        load_dataset(["just a string"])


def test_none_input_is_rejected() -> None:
    with pytest.raises(DatasetError, match=r"row 0 has x = None"):
        load_dataset([(None, "a")])


def test_mismatched_inputs_and_infos_lengths() -> None:
    with pytest.raises(DatasetError, match=r"'inputs'\] has 3 items but dataset\['infos'\] has 2"):
        load_dataset({"inputs": [1, 2, 3], "infos": [1, 2]})


def test_trace_dict_missing_or_extra_keys() -> None:
    with pytest.raises(DatasetError, match=r"missing \['infos'\]"):
        load_dataset({"inputs": [1]})
    with pytest.raises(DatasetError, match=r"unexpected keys \['ids'\]"):
        load_dataset({"inputs": [1], "infos": [1], "ids": ["a"]})


def test_bad_json_line_reports_its_line_number(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text('{"x": "a", "info": "b"}\n\n{"x": "c", "info": }\n', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"line 3 of .*data\.jsonl is not valid JSON"):
        load_dataset(path)


def test_jsonl_row_that_is_not_an_object(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text('{"x": "a"}\n["b", "c"]\n', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"line 2 of .* is a JSON list, not an object"):
        load_dataset(path)


def test_jsonl_row_missing_x_reports_line_number(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text('\n{"x": "a"}\n{"info": "b"}\n', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"line 3 of .* has no 'x' key"):
        load_dataset(path)


@pytest.mark.parametrize("content", [b"\x1f\x8b\x08\x00gzip", '{"x": 1}\n'.encode() + b"\xff\xfe oops\n"])
def test_a_binary_file_is_a_dataset_error_naming_the_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "data.jsonl"
    path.write_bytes(content)
    with pytest.raises(DatasetError, match="not UTF-8 text") as caught:
        load_dataset(path)
    assert str(path) in str(caught.value)
    assert ("on line 2" if content.startswith(b"{") else "on line 1") in str(caught.value)


def test_a_row_may_hold_unicode_line_separators(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text('{"x": "a\u2028b", "info": "c\u0085d"}\n', encoding="utf-8")
    [example] = load_dataset(path)
    assert example.x == "a\u2028b" and example.info == "c\u0085d"


def test_missing_file() -> None:
    with pytest.raises(FileNotFoundError, match="dataset file not found"):
        load_dataset("/nonexistent/data.jsonl")


def test_duplicate_id_names_both_rows() -> None:
    with pytest.raises(DatasetError, match=r"row 2 has id 'a', already used by row 0"):
        load_dataset([{"x": 1, "id": "a"}, {"x": 2, "id": "b"}, {"x": 3, "id": "a"}])


def test_explicit_id_clashing_with_default_index_id() -> None:
    with pytest.raises(DatasetError, match=r"row 1 has id '0', already used by row 0"):
        load_dataset([{"x": 1}, {"x": 2, "id": "0"}])


def test_bad_id_type() -> None:
    with pytest.raises(DatasetError, match=r"row 0 has an id of type list"):
        load_dataset([{"x": 1, "id": ["a"]}])


@pytest.mark.parametrize("empty", [[], {"inputs": [], "infos": []}])
def test_empty_dataset(empty: object) -> None:
    with pytest.raises(DatasetError, match="empty"):
        load_dataset(empty)


def test_empty_jsonl_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n", encoding="utf-8")
    with pytest.raises(DatasetError, match="empty"):
        load_dataset(path)


def test_not_a_dataset() -> None:
    with pytest.raises(DatasetError, match="cannot read a dataset from a int"):
        load_dataset(42)
    with pytest.raises(DatasetError, match="single Example"):
        load_dataset(Example("q"))


def test_dataset_error_is_a_value_error() -> None:
    assert issubclass(DatasetError, ValueError)


# --- DataLoader ------------------------------------------------------------------------


def _data(n: int) -> list[tuple[str, int]]:
    return [(f"q{i}", i) for i in range(n)]


def _ids(batches: list[list[Example]]) -> list[list[str | None]]:
    return [[e.id for e in batch] for batch in batches]


def test_batch_size_is_validated() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
            DataLoader(_data(3), batch_size=bad)


def test_len_and_last_partial_batch() -> None:
    loader = DataLoader(_data(10), batch_size=4)
    assert len(loader) == 3
    batches = list(loader)
    assert [len(b) for b in batches] == [4, 4, 2]


def test_each_epoch_covers_every_example_once() -> None:
    loader = DataLoader(_data(10), batch_size=3, seed=5)
    for _ in range(3):
        ids = [e.id for batch in loader for e in batch]
        assert sorted(ids, key=int) == [str(i) for i in range(10)]


def test_epochs_differ_and_shuffle_changes_order() -> None:
    loader = DataLoader(_data(20), batch_size=20, seed=0)
    first, second = list(loader), list(loader)
    assert _ids(first) != _ids(second)
    assert _ids(first) != [[str(i) for i in range(20)]]


def test_same_seed_is_deterministic_and_different_seeds_differ() -> None:
    def run(seed: int) -> list[list[str | None]]:
        loader = DataLoader(_data(20), batch_size=3, seed=seed)
        return [[e.id for e in batch] for _, _, batch in loader.iter_batches(2)]

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_any_epoch_is_reproducible_without_replaying_earlier_ones() -> None:
    loader = DataLoader(_data(12), batch_size=5, seed=3)
    epochs = [list(loader) for _ in range(3)]
    assert _ids(DataLoader(_data(12), batch_size=5, seed=3).epoch_batches(2)) == _ids(epochs[2])


def test_no_shuffle_keeps_dataset_order() -> None:
    loader = DataLoader(_data(5), batch_size=2, shuffle=False)
    assert _ids(list(loader)) == [["0", "1"], ["2", "3"], ["4"]]
    assert _ids(list(loader)) == [["0", "1"], ["2", "3"], ["4"]]


def test_iter_batches_yields_epoch_and_step() -> None:
    loader = DataLoader(_data(5), batch_size=2)
    positions = [(epoch, step) for epoch, step, _ in loader.iter_batches(2)]
    assert positions == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert loader.state_dict()["epoch"] == 2 and loader.state_dict()["step"] == 0
    assert list(loader.iter_batches(2)) == []


def test_state_dict_is_json_able_and_tracks_position() -> None:
    loader = DataLoader(_data(7), batch_size=3, seed=9)
    batches = loader.iter_batches(1)
    next(batches)
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["epoch"] == 0 and state["step"] == 1 and state["seed"] == 9


@pytest.mark.parametrize("stop_after", [1, 4, 5, 7])
def test_resume_mid_run_yields_exactly_the_remaining_batches(stop_after: int) -> None:
    uninterrupted = [
        (epoch, step, [e.id for e in batch])
        for epoch, step, batch in DataLoader(_data(11), batch_size=4, seed=7).iter_batches(3)
    ]

    first = DataLoader(_data(11), batch_size=4, seed=7)
    seen = []
    for epoch, step, batch in first.iter_batches(3):
        seen.append((epoch, step, [e.id for e in batch]))
        if len(seen) == stop_after:
            break  # the run is interrupted here
    saved = json.dumps(first.state_dict())

    resumed = DataLoader(_data(11), batch_size=4, seed=0)  # the seed comes from the state
    resumed.load_state_dict(json.loads(saved))
    rest = [(epoch, step, [e.id for e in batch]) for epoch, step, batch in resumed.iter_batches(3)]
    assert seen + rest == uninterrupted


def test_iterating_a_resumed_loader_finishes_the_current_epoch() -> None:
    loader = DataLoader(_data(6), batch_size=2, seed=1)
    full_epoch = _ids(loader.epoch_batches(0))
    loader.load_state_dict({"epoch": 0, "step": 2, "seed": 1})
    assert _ids(list(loader)) == full_epoch[2:]
    assert (loader.epoch, loader.step) == (1, 0)


def test_load_state_dict_rejects_a_different_dataset_or_batch_size() -> None:
    state = DataLoader(_data(6), batch_size=2).state_dict()
    with pytest.raises(ValueError, match="batch_size=2 but this loader has batch_size=3"):
        DataLoader(_data(6), batch_size=3).load_state_dict(state)
    with pytest.raises(ValueError, match="num_examples=6 but this loader has num_examples=5"):
        DataLoader(_data(5), batch_size=2).load_state_dict(state)
    with pytest.raises(ValueError, match="missing"):
        DataLoader(_data(6), batch_size=2).load_state_dict({"epoch": 0})
    with pytest.raises(ValueError, match="step 3"):
        DataLoader(_data(6), batch_size=2).load_state_dict({"epoch": 0, "step": 3, "seed": 0})
