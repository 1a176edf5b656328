"""BIG-bench tasks as lists of `Example`: the ones shipped with opto, or any task file.

The task files are copied unchanged from the BIG-bench project (Apache License 2.0); see
`bigbench_data/README.md` for the attribution. Each example becomes:

- `x`: a self-contained question: the task's instruction (`task_prefix`), the example's
  input after its `example_input_prefix` (e.g. "Sort the following words
  alphabetically:\\nList: stick gelatine"), and, for the multiple-choice tasks, the
  options, one per line after "Options:".
- `info`: the list of accepted answers: object_counting's targets (`["three", "3"]`),
  word_sorting's sorted string as a one-item list, or the option(s) scored 1 for the
  multiple-choice tasks (`["plausible"]`).

The options are always appended, although both multiple-choice files set
`append_choices_to_input: false`: that flag is for BIG-bench's likelihood scoring, where
the model never has to write an option; here the model generates the answer, and the
logical-deduction options (full sentences) cannot be guessed without seeing them.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ..core.data import DatasetError, Example
from ..errors import MissingFileError, OptoValueError

__all__ = ["SPLIT_FRACTIONS", "bigbench", "bigbench_tasks", "load_bigbench"]

_TASKS = (
    "object_counting",
    "word_sorting",
    "sports_understanding",
    "logical_deduction_three_objects",
    "plural",
    "past_tense",
)

#: Fractions of each task's shuffled examples in the train, validation and test splits
#: (test takes what is left after rounding the first two down).
SPLIT_FRACTIONS: dict[str, float] = {"train": 0.5, "validation": 0.25, "test": 0.25}


def bigbench_tasks() -> list[str]:
    """The names of the shipped BIG-bench tasks."""
    return list(_TASKS)


def bigbench(task: str, split: str = "train", n: int | None = None, seed: int = 0) -> list[Example]:
    """Load one split of a shipped BIG-bench task.

    The examples are shuffled with `numpy.random.default_rng(seed)` and cut into
    train (first 50%), validation (next 25%) and test (the rest, about 25%); the three
    splits of one seed are disjoint and together hold every example. `split="all"`
    returns every example in file order. `n` keeps the first `n` examples of the split
    (all of them when the split is smaller). Ids are `"{task}-{index in the file}"`.

    Args:
        task: one of `bigbench_tasks()`.
        split: "train", "validation", "test" or "all".
        n: at most this many examples; None for the whole split.
        seed: the shuffle seed (a different seed gives different splits).
    """
    if task not in _TASKS:
        raise OptoValueError(f"unknown BIG-bench task {task!r}; the shipped tasks are {', '.join(_TASKS)}")
    return _split(task, _load_task(task), split, n, seed)


def load_bigbench(path: str | Path, split: str = "all", n: int | None = None, seed: int = 0) -> list[Example]:
    """Load any BIG-bench task file (`task.json` of the BIG-bench repository or package).

    The file's `examples` (each with `input` and `target` or `target_scores`) become
    examples exactly as for the shipped tasks (see the module docstring); splits, `n`
    and `seed` work as in `bigbench`. The task's name (for ids) is the file's `name`
    field, else its folder's name for a `task.json`, else the file name.

    Raises `DatasetError` naming the file when it is not a BIG-bench JSON task (for
    example a task with subtasks, whose examples live in the subtask folders, or a
    programmatic task with no `examples`).
    """
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"BIG-bench task file not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path} is not a BIG-bench task: it is not JSON text ({exc})") from None
    examples = data.get("examples") if isinstance(data, dict) else None
    if not isinstance(examples, list) or not examples:
        hint = (
            " (it has subtasks: load the task.json of one subtask folder)"
            if isinstance(data, dict) and data.get("subtasks")
            else ""
        )
        raise DatasetError(f"{path} is not a BIG-bench JSON task: it has no non-empty 'examples' list{hint}")
    for index, row in enumerate(examples):
        if not isinstance(row, dict) or "input" not in row or not ("target" in row or "target_scores" in row):
            raise DatasetError(
                f"{path}: example {index} needs 'input' and 'target' or 'target_scores' (got {_keys(row)})"
            )
    name = data.get("name") if isinstance(data.get("name"), str) else None
    task = name or (path.parent.name if path.name == "task.json" else path.stem)
    return _split(task.replace(" ", "_"), data, split, n, seed)


def _keys(row: Any) -> str:
    return f"keys {sorted(row)}" if isinstance(row, dict) else f"a {type(row).__name__}"


def _split(task: str, data: dict[str, Any], split: str, n: int | None, seed: int) -> list[Example]:
    if split != "all" and split not in SPLIT_FRACTIONS:
        raise OptoValueError(f"unknown split {split!r}; use one of 'train', 'validation', 'test' or 'all'")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
        raise OptoValueError(f"n must be an int >= 0 or None, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise OptoValueError(f"seed must be an int >= 0, got {seed!r}")
    examples = data["examples"]
    if split == "all":
        indices = list(range(len(examples)))
    else:
        order = np.random.default_rng(seed).permutation(len(examples))
        n_train = int(len(examples) * SPLIT_FRACTIONS["train"])
        n_validation = int(len(examples) * SPLIT_FRACTIONS["validation"])
        bounds = {
            "train": (0, n_train),
            "validation": (n_train, n_train + n_validation),
            "test": (n_train + n_validation, len(examples)),
        }
        start, stop = bounds[split]
        indices = [int(i) for i in order[start:stop]]
    if n is not None:
        indices = indices[:n]
    return [_to_example(task, data, index) for index in indices]


@functools.cache
def _load_task(task: str) -> dict[str, Any]:
    source = resources.files("opto.datasets") / "bigbench_data" / f"{task}.json"
    return json.loads(source.read_text(encoding="utf-8"))


def _to_example(task: str, data: dict[str, Any], index: int) -> Example:
    row = data["examples"][index]
    text = str(data.get("example_input_prefix", "")) + row["input"]
    instruction = str(data.get("task_prefix", "")).strip()
    if instruction:
        text = instruction + ("" if text.startswith("\n") else "\n\n") + text
    text = text.strip()
    if "target_scores" in row:
        options = list(row["target_scores"])
        text += "\nOptions:\n" + "\n".join(f"- {option}" for option in options)
        answers = [option for option, score in row["target_scores"].items() if score == 1]
    else:
        target = row["target"]
        answers = [str(t) for t in target] if isinstance(target, list) else [str(target)]
    return Example(text, info=answers, id=f"{task}-{index}")
