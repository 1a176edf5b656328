"""A seeded, shuffled train/validation split that keeps each example on one side."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, TypeVar

from ..errors import OptoValueError

__all__ = ["train_validation_split"]

T = TypeVar("T")


def train_validation_split(
    items: Sequence[T], validation_fraction: float = 0.1, *, seed: int = 0
) -> tuple[list[T], list[T]]:
    """Split pairs (or supervised examples) into shuffled train and validation lists.

    Items are split by their `example_id`, so every pair of one example lands on the same
    side and the validation set measures generalisation to unseen examples, not to other
    pairs of the same prompt. About `validation_fraction` of the examples go to
    validation (at least one when the fraction is > 0 and there are two examples or
    more; never all of them). The same seed and items give the same split.
    """
    if not 0.0 <= validation_fraction < 1.0:
        raise OptoValueError(f"validation_fraction must be within [0, 1), got {validation_fraction}")
    rng = random.Random(seed)
    groups: dict[str, list[T]] = {}
    for item in items:
        groups.setdefault(str(_example_id(item)), []).append(item)
    names = list(groups)
    rng.shuffle(names)
    count = round(validation_fraction * len(names))
    if validation_fraction > 0 and len(names) >= 2:
        count = min(max(count, 1), len(names) - 1)
    validation_names = set(names[:count])
    train = [item for name in names[count:] for item in groups[name]]
    validation = [item for name in names if name in validation_names for item in groups[name]]
    rng.shuffle(train)
    rng.shuffle(validation)
    return train, validation


def _example_id(item: Any) -> Any:
    return getattr(item, "example_id", None) if not isinstance(item, dict) else item.get("example_id")
