"""Datasets of examples and a resumable, seeded batch loader.

`load_dataset` turns the shapes people keep data in (lists of pairs, dicts, a Trace-style
`{"inputs", "infos"}` dict, a JSONL file) into a list of `Example`, and checks every row
up front, so a malformed dataset fails before any model is called. `DataLoader` cuts
the examples into batches in a per-epoch order that depends only on `(seed, epoch)`, and
its `state_dict()` says where to pick up after an interruption.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from ..errors import MissingFileError, OptoError, OptoValueError

__all__ = ["DataLoader", "DatasetError", "Example", "load_dataset"]

_ROW_KEYS = {"x", "info", "id"}
_TRACE_KEYS = {"inputs", "infos"}


class DatasetError(OptoError, ValueError):
    """A dataset (or one of its rows) cannot be read as examples."""


class Example(BaseModel):
    """One task instance: the input `x`, the `info` a guide judges against, and an id.

    `info` is whatever the guide needs (e.g. the accepted answers); `id` names the example
    in logs and results. Construct positionally, `Example(x, info)`, or by keyword.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    x: Any
    info: Any = None
    id: str | None = None

    def __init__(self, x: Any, info: Any = None, id: str | None = None, **kw: Any) -> None:
        super().__init__(x=x, info=info, id=id, **kw)


def load_dataset(dataset: Any) -> list[Example]:
    """Read a dataset into a list of `Example`, checking every row.

    Accepted shapes:

    - a list of `Example`;
    - a list of `(x, info)` pairs (tuples or lists of length 2);
    - a list of dicts with an `x` key and optional `info` and `id` keys;
    - a Trace-style dict `{"inputs": [...], "infos": [...]}` of equal lengths;
    - a path (str or `Path`) to a JSONL file, one such dict per line (blank lines are skipped).

    An example without an id gets its row index as id (`"0"`, `"1"`, ...). Ids must be
    unique. Raises `DatasetError` naming the offending row for a malformed row, a
    duplicate id or an empty dataset; `FileNotFoundError` for a missing file.
    """
    if isinstance(dataset, (str, Path)):
        rows = _read_jsonl(Path(dataset))
    elif isinstance(dataset, dict):
        rows = _trace_rows(dataset)
    elif isinstance(dataset, Example):
        raise DatasetError("load_dataset got a single Example; pass a list of examples, e.g. [example]")
    elif isinstance(dataset, (bytes, bytearray)) or not hasattr(dataset, "__iter__"):
        raise DatasetError(
            f"cannot read a dataset from a {type(dataset).__name__}; pass a list of examples, (x, info) pairs "
            "or {'x', 'info'} dicts, a {'inputs': [...], 'infos': [...]} dict, or a path to a JSONL file"
        )
    else:
        rows = [(f"row {index}", row) for index, row in enumerate(dataset)]
    if not rows:
        raise DatasetError("the dataset is empty; it needs at least one example")

    examples = [_to_example(row, where, index) for index, (where, row) in enumerate(rows)]
    seen: dict[str, str] = {}
    for (where, _), example in zip(rows, examples):
        assert example.id is not None
        if example.id in seen:
            raise DatasetError(
                f"{where} has id {example.id!r}, already used by {seen[example.id]}; ids must be unique "
                "(rows without an id get their row index as id, which can clash with explicit ids)"
            )
        seen[example.id] = where
    return examples


def _read_jsonl(path: Path) -> list[tuple[str, Any]]:
    if not path.is_file():
        raise MissingFileError(f"dataset file not found: {path}")
    rows: list[tuple[str, Any]] = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        bad_line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise DatasetError(
            f"{path} is not UTF-8 text (byte {exc.start}, on line {bad_line}, cannot be decoded: {exc.reason}); "
            "a dataset file must be JSON lines in UTF-8 (is it a binary or compressed file?)"
        ) from None
    # split on "\n" only: JSON text may hold U+2028, which splitlines() would break on
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"line {number} of {path}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(
                f"{where} is not valid JSON ({exc.msg} at column {exc.colno}); each line must be one "
                'JSON object such as {"x": "question", "info": "answer"}'
            ) from exc
        if not isinstance(row, dict):
            raise DatasetError(
                f'{where} is a JSON {type(row).__name__}, not an object; write each row as {{"x": ..., "info": ...}}'
            )
        rows.append((where, row))
    return rows


def _trace_rows(dataset: dict[str, Any]) -> list[tuple[str, Any]]:
    missing = _TRACE_KEYS - dataset.keys()
    if missing:
        raise DatasetError(
            f"a dict dataset needs the keys 'inputs' and 'infos' (missing {sorted(missing)}); "
            "for a list of rows pass a list of {'x': ..., 'info': ...} dicts instead"
        )
    extra = dataset.keys() - _TRACE_KEYS
    if extra:
        raise DatasetError(f"a dict dataset has only 'inputs' and 'infos', got unexpected keys {sorted(extra)}")
    inputs, infos = dataset["inputs"], dataset["infos"]
    for key, value in (("inputs", inputs), ("infos", infos)):
        if not isinstance(value, (list, tuple)):
            raise DatasetError(f"dataset[{key!r}] must be a list, got {type(value).__name__}")
    if len(inputs) != len(infos):
        raise DatasetError(
            f"dataset['inputs'] has {len(inputs)} items but dataset['infos'] has {len(infos)}; "
            "they must have equal lengths (infos[i] belongs to inputs[i])"
        )
    return [(f"row {i} (inputs[{i}], infos[{i}])", (x, info)) for i, (x, info) in enumerate(zip(inputs, infos))]


def _to_example(row: Any, where: str, index: int) -> Example:
    """One row as an Example with an id (its index when it has none)."""
    if isinstance(row, Example):
        if row.id is not None and row.x is not None and type(row) is Example:
            return row  # frozen and complete: the same example serves
        x, info, id_ = row.x, row.info, row.id
    elif isinstance(row, (tuple, list)):
        if len(row) != 2:
            raise DatasetError(
                f"{where} is a {type(row).__name__} of {len(row)} items; a pair row must be (x, info) with "
                "exactly 2 items (use a dict {'x': ..., 'info': ..., 'id': ...} for more fields)"
            )
        x, info, id_ = row[0], row[1], None
    elif isinstance(row, dict):
        if "x" not in row:
            hint = " (rename 'input' to 'x')" if "input" in row else ""
            raise DatasetError(f"{where} has no 'x' key{hint}; each row needs its input under 'x'")
        if not row.keys() <= _ROW_KEYS:
            extra = row.keys() - _ROW_KEYS
            raise DatasetError(
                f"{where} has unexpected keys {sorted(map(str, extra))}; a row has only 'x', 'info' and 'id' "
                "(put extra data inside 'info')"
            )
        x, info, id_ = row["x"], row.get("info"), row.get("id")
    else:
        raise DatasetError(
            f"{where} is a {type(row).__name__}; each row must be an Example, an (x, info) pair or a "
            "{'x': ..., 'info': ...} dict"
        )
    if x is None:
        raise DatasetError(f"{where} has x = None; every example needs an input")
    if id_ is None:
        id_ = str(index)
    elif isinstance(id_, int) and not isinstance(id_, bool):
        id_ = str(id_)
    elif not isinstance(id_, str):
        raise DatasetError(f"{where} has an id of type {type(id_).__name__}; an id must be a str (or an int)")
    return Example(x, info=info, id=id_)


class DataLoader:
    """Seeded batches of examples, one epoch at a time, resumable from `state_dict()`.

    Epoch `e` visits the examples in the order of `numpy.random.default_rng([seed, e])`
    (or in dataset order when `shuffle=False`), so any epoch is reproducible on its own.
    The last batch of an epoch may be smaller than `batch_size`.

    Iterating the loader (`for batch in loader`) yields the batches left in the current
    epoch and moves on to the next one; `iter_batches(num_epochs)` yields
    `(epoch, step, batch)` until `num_epochs` epochs are done. Both advance the loader's
    position as they yield, so `state_dict()` taken after a batch was handled resumes
    right after it.

    Args:
        dataset: anything `load_dataset` accepts.
        batch_size: examples per batch (>= 1).
        shuffle: shuffle each epoch; False keeps the dataset order.
        seed: a non-negative int fixing every epoch's order.
    """

    def __init__(self, dataset: Any, batch_size: int = 1, shuffle: bool = True, seed: int = 0) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise OptoValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        _check_seed(seed)
        self.dataset: list[Example] = load_dataset(dataset)
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.seed = seed
        self._epoch = 0
        self._step = 0
        self._order_cache: tuple[int, np.ndarray] | None = None

    def __len__(self) -> int:
        """Batches per epoch."""
        return math.ceil(len(self.dataset) / self.batch_size)

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from (0-based)."""
        return self._epoch

    @property
    def step(self) -> int:
        """The index, within its epoch, of the next batch."""
        return self._step

    def epoch_batches(self, epoch: int) -> list[list[Example]]:
        """All batches of `epoch`, in order (does not move the loader)."""
        return [self._batch(epoch, step) for step in range(len(self))]

    def __iter__(self) -> Iterator[list[Example]]:
        """The batches left in the current epoch; the loader then stands at the next epoch."""
        for _, _, batch in self.iter_batches(self._epoch + 1):
            yield batch

    def iter_batches(self, num_epochs: int) -> Iterator[tuple[int, int, list[Example]]]:
        """Yield `(epoch, step, batch)` from the current position until epoch `num_epochs`.

        `num_epochs` counts from epoch 0, not from the current position: a loader restored
        with `load_state_dict` stops where the uninterrupted run would have stopped.
        """
        if isinstance(num_epochs, bool) or not isinstance(num_epochs, int) or num_epochs < 0:
            raise OptoValueError(f"num_epochs must be an int >= 0, got {num_epochs!r}")
        return self._generate(num_epochs)

    def _generate(self, num_epochs: int) -> Iterator[tuple[int, int, list[Example]]]:
        while self._epoch < num_epochs:
            epoch, step = self._epoch, self._step
            batch = self._batch(epoch, step)
            if step + 1 >= len(self):
                self._epoch, self._step = epoch + 1, 0
            else:
                self._step = step + 1
            yield epoch, step, batch

    def state_dict(self) -> dict[str, Any]:
        """The position (next epoch and step) and the settings it depends on, as JSON-able values."""
        return {
            "epoch": self._epoch,
            "step": self._step,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch_size": self.batch_size,
            "num_examples": len(self.dataset),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a `state_dict()`; the dataset and batch size must be the same as then."""
        missing = {"epoch", "step", "seed"} - set(state)
        if missing:
            raise OptoValueError(f"loader state is missing {sorted(missing)}; pass a dict from DataLoader.state_dict()")
        for key, current in (("batch_size", self.batch_size), ("num_examples", len(self.dataset))):
            if key in state and state[key] != current:
                raise OptoValueError(
                    f"loader state was saved with {key}={state[key]} but this loader has {key}={current}; "
                    "resume with the same dataset and batch size"
                )
        epoch, step, seed = state["epoch"], state["step"], state["seed"]
        _check_seed(seed)
        if not isinstance(epoch, int) or epoch < 0:
            raise OptoValueError(f"loader state has an invalid epoch {epoch!r}; it must be an int >= 0")
        if not isinstance(step, int) or not 0 <= step < len(self):
            raise OptoValueError(f"loader state has step {step!r}; this loader has steps 0..{len(self) - 1} per epoch")
        self.seed = seed
        self.shuffle = bool(state.get("shuffle", self.shuffle))
        self._epoch, self._step = epoch, step
        self._order_cache = None

    def _order(self, epoch: int) -> np.ndarray:
        if self._order_cache is None or self._order_cache[0] != epoch:
            n = len(self.dataset)
            order = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
            self._order_cache = (epoch, order)
        return self._order_cache[1]

    def _batch(self, epoch: int, step: int) -> list[Example]:
        indices = self._order(epoch)[step * self.batch_size : (step + 1) * self.batch_size]
        return [self.dataset[int(i)] for i in indices]

    def __repr__(self) -> str:
        return (
            f"DataLoader({len(self.dataset)} examples, batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"seed={self.seed}, epoch={self._epoch}, step={self._step})"
        )


def _check_seed(seed: Any) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise OptoValueError(f"seed must be an int >= 0, got {seed!r}")
