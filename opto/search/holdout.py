"""The default validation: a validation split held out from the training data.

Accepting on the step's own batch accepts noise (a run touches a good score and drifts
away from it); accepting on a validation set keeps what a run finds. When `train()` gets
no validation set (`validation="auto"`, the default) and the training data is large
enough, `HoldOut` sets a seeded share of it aside: the search never proposes from those
examples, and candidates are accepted on them (`MinibatchFirst`: screened on the step's
batch, then raced on the split, ties accepted). The split's example ids go into the
checkpoint's settings (and `split.json`), and a resumed run must draw the same.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from ..core.data import Example
from ..errors import OptoValueError

__all__ = ["HoldOut"]


@dataclass(frozen=True)
class HoldOut:
    """How much of the training data `validation="auto"` holds out.

    `fraction` of the examples, at least `min_size` and at most `max_size`, drawn with the
    run's seed; a training set with fewer than `2 * min_size` examples is not split (the
    run then accepts on the batch, with a paired test). Fewer than 16 validation examples
    decide too noisily: on `bench/search.py` a minimum of 16 instead of 8 raised the runs
    that keep what they find from 18 to 20 of 20.
    """

    fraction: float = 0.25
    min_size: int = 16
    max_size: int = 200

    def __post_init__(self) -> None:
        if not 0 < self.fraction < 1:
            raise OptoValueError(f"HoldOut fraction must be within (0, 1), got {self.fraction!r}")
        if self.min_size < 1 or self.max_size < self.min_size:
            raise OptoValueError(f"HoldOut needs 1 <= min_size <= max_size, got {self.min_size}, {self.max_size}")

    def split(self, examples: list[Example], seed: int) -> tuple[list[Example], list[Example]] | None:
        """(training examples, held-out examples), both in their original order; None when
        the data is too small to split."""
        if len(examples) < 2 * self.min_size:
            return None
        return seeded_split(examples, self.fraction, self.min_size, self.max_size, f"opto-holdout|{seed}")

    def describe(self) -> dict[str, Any]:
        return {"fraction": self.fraction, "min_size": self.min_size, "max_size": self.max_size}


def seeded_split(
    examples: list[Example], fraction: float, min_size: int, max_size: int, salt: str
) -> tuple[list[Example], list[Example]]:
    """(the rest, a share of `fraction` of `examples`, at least `min_size`, at most
    `max_size`), both in their original order, drawn with a generator seeded by `salt`."""
    size = min(max_size, max(min_size, round(fraction * len(examples))))
    chosen = set(random.Random(salt).sample(range(len(examples)), size))
    return [e for i, e in enumerate(examples) if i not in chosen], [e for i, e in enumerate(examples) if i in chosen]
