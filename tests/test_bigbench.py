"""Tests of the shipped BIG-bench tasks."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from opto.core.data import Example, load_dataset
from opto.datasets import SPLIT_FRACTIONS, bigbench, bigbench_tasks

TASKS = ["object_counting", "word_sorting", "sports_understanding", "logical_deduction_three_objects", "plural",
         "past_tense"]
SIZES = {"object_counting": 1000, "word_sorting": 1900, "sports_understanding": 1000, "logical_deduction_three_objects": 300,
         "plural": 1702, "past_tense": 1775}


def test_task_list() -> None:
    assert bigbench_tasks() == TASKS


@pytest.mark.parametrize("task", TASKS)
def test_each_task_loads_with_answers(task: str) -> None:
    examples = bigbench(task, split="all")
    assert len(examples) == SIZES[task]
    assert all(isinstance(e, Example) for e in examples)
    assert all(isinstance(e.x, str) and e.x for e in examples)
    assert all(isinstance(e.info, list) and e.info and all(isinstance(a, str) and a for a in e.info) for e in examples)
    assert [e.id for e in examples] == [f"{task}-{i}" for i in range(SIZES[task])]
    assert load_dataset(examples) == examples  # valid for the data layer: unique ids, no malformed row


@pytest.mark.parametrize("task", TASKS)
def test_splits_are_disjoint_and_cover_the_task(task: str) -> None:
    splits = {name: [e.id for e in bigbench(task, split=name, seed=3)] for name in SPLIT_FRACTIONS}
    ids = [i for name in splits for i in splits[name]]
    assert len(ids) == len(set(ids)) == SIZES[task]
    assert set(ids) == {e.id for e in bigbench(task, split="all")}
    assert len(splits["train"]) == SIZES[task] // 2
    assert len(splits["validation"]) == SIZES[task] // 4


def test_splits_depend_on_the_seed_only() -> None:
    assert bigbench("object_counting", seed=1) == bigbench("object_counting", seed=1)
    assert bigbench("object_counting", seed=1) != bigbench("object_counting", seed=2)


def test_object_counting_info_lists_word_and_digits() -> None:
    examples = {e.id: e for e in bigbench("object_counting", split="all")}
    first = examples["object_counting-0"]
    assert first.x == "I have a clarinet, a violin, and a flute. How many musical instruments do I have?"
    assert first.info == ["three", "3"]


def test_word_sorting_input_has_the_instruction_and_target_is_one_string() -> None:
    example = bigbench("word_sorting", split="all", n=1)[0]
    assert example.x == "Sort the following words alphabetically:\nList: stick gelatine"
    assert example.info == ["gelatine stick"]


def test_multiple_choice_inputs_list_the_options_and_info_is_the_correct_one() -> None:
    sports = bigbench("sports_understanding", split="all", n=1)[0]
    assert sports.x.startswith("Determine whether the following statement")
    assert "Statement: Jamal Murray was perfect from the line" in sports.x
    assert sports.x.endswith("Options:\n- plausible\n- implausible")
    assert sports.info == ["plausible"]

    deduction = bigbench("logical_deduction_three_objects", split="all")[1]
    assert "On a shelf, there are three books" in deduction.x
    assert "- The black book is the second from the left." in deduction.x
    assert deduction.info == ["The orange book is the second from the left."]


def test_n_takes_the_first_examples_of_the_split() -> None:
    train = bigbench("sports_understanding", split="train", seed=4)
    assert bigbench("sports_understanding", split="train", n=10, seed=4) == train[:10]
    assert bigbench("sports_understanding", split="train", n=0) == []
    assert len(bigbench("logical_deduction_three_objects", split="test", n=10_000)) == 75


def test_unknown_task_lists_the_shipped_ones() -> None:
    with pytest.raises(ValueError, match="unknown BIG-bench task 'date_understanding'.*object_counting.*word_sorting"):
        bigbench("date_understanding")


def test_bad_split_and_n() -> None:
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        bigbench("object_counting", split="dev")
    with pytest.raises(ValueError, match="n must be an int >= 0"):
        bigbench("object_counting", n=-1)


def test_shipped_files_keep_the_canary_and_attribution() -> None:
    folder = resources.files("opto.datasets") / "bigbench_data"
    for task in TASKS:
        data = json.loads((folder / f"{task}.json").read_text(encoding="utf-8"))
        assert "canary GUID" in data["canary"]
    readme = (folder / "README.md").read_text(encoding="utf-8")
    assert "BIG-bench" in readme and "Apache License 2.0" in readme


# --- any BIG-bench task file --------------------------------------------------------------

from opto.core.data import DatasetError  # noqa: E402
from opto.datasets import load_bigbench  # noqa: E402


def _shipped_file(task: str):
    return resources.files("opto.datasets") / "bigbench_data" / f"{task}.json"


@pytest.mark.parametrize("task", ["sports_understanding", "object_counting"])
def test_load_bigbench_reads_a_task_file_like_the_shipped_loader(tmp_path, task: str) -> None:
    folder = tmp_path / task
    folder.mkdir()
    (folder / "task.json").write_text(_shipped_file(task).read_text(encoding="utf-8"), encoding="utf-8")
    loaded = load_bigbench(folder / "task.json", split="validation", n=20, seed=2)
    shipped = bigbench(task, split="validation", n=20, seed=2)
    assert [(e.x, e.info) for e in loaded] == [(e.x, e.info) for e in shipped]
    assert loaded[0].id.split("-")[0] in (task, json.loads(_shipped_file(task).read_text())["name"].replace(" ", "_"))


def test_load_bigbench_names_a_file_that_is_not_a_json_task(tmp_path) -> None:
    subtasks = tmp_path / "task.json"
    subtasks.write_text(json.dumps({"name": "x", "subtasks": ["a"], "examples": []}))
    with pytest.raises(DatasetError, match="subtasks"):
        load_bigbench(subtasks)
    bad_row = tmp_path / "bad.json"
    bad_row.write_text(json.dumps({"examples": [{"input": "a", "target": "b"}, {"question": "c"}]}))
    with pytest.raises(DatasetError, match="bad.json: example 1 needs 'input'"):
        load_bigbench(bad_row)
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\x1f\x8b\x00\xff")
    with pytest.raises(DatasetError, match="bin.json is not a BIG-bench task"):
        load_bigbench(binary)
    with pytest.raises(FileNotFoundError):
        load_bigbench(tmp_path / "missing.json")


def test_load_bigbench_reads_a_file_of_the_bigbench_package_shape(tmp_path) -> None:
    task = {"name": "tiny arithmetic", "description": "d", "task_prefix": "Compute.",
            "examples": [{"input": "1+1=", "target": "2"}, {"input": "2+2=", "target": ["4", "four"]},
                         {"input": "Is 3 odd?", "target_scores": {"yes": 1, "no": 0}}]}
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(task))
    examples = load_bigbench(path)
    assert [e.info for e in examples] == [["2"], ["4", "four"], ["yes"]]
    assert examples[0].x == "Compute.\n\n1+1=" and examples[2].x.endswith("Options:\n- yes\n- no")
    assert [e.id for e in examples] == ["tiny_arithmetic-0", "tiny_arithmetic-1", "tiny_arithmetic-2"]
