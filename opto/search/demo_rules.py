"""Rules for changing a list of few-shot demos: add one, and merge several proposals.

Demo lists are edited by rule, never by an LLM: a demo is a real training example, and a
model asked to rewrite the list could invent or corrupt examples.

Adding a demo to a full list replaces the *least useful* one, chosen to keep the
outputs balanced (a list of demos that all answer "yes" teaches the model to answer
"yes"): the oldest demo whose output is the most frequent in the list, when the new
demo's output is rarer than that; otherwise the oldest demo with the new demo's own
output (the balance stays as it is); otherwise the oldest demo. A demo whose input is
already in the list is not added again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from .._util.files import json_key

__all__ = ["add_demo", "merge_demo_lists", "shows_input"]


def shows_input(demos: Sequence[dict[str, Any]], value: Any) -> bool:
    """Whether a demo in `demos` already has `value` as its input."""
    key = json_key(value)
    return any(json_key(d["input"]) == key for d in demos)


def add_demo(demos: Sequence[dict[str, Any]], new: dict[str, Any], max_demos: int) -> list[dict[str, Any]] | None:
    """`demos` with `new` added (replacing the least useful one when full); None when
    `new`'s input is already there."""
    if shows_input(demos, new["input"]):
        return None
    current = [dict(d) for d in demos]
    if len(current) < max_demos:
        return [*current, dict(new)]
    outputs = Counter(json_key(d["output"]) for d in current)
    most_common, most = outputs.most_common(1)[0]
    own = json_key(new["output"])
    if outputs.get(own, 0) < most:
        victim = next(i for i, d in enumerate(current) if json_key(d["output"]) == most_common)
    elif own in outputs:
        victim = next(i for i, d in enumerate(current) if json_key(d["output"]) == own)
    else:
        victim = 0
    del current[victim]
    return [*current, dict(new)]


def merge_demo_lists(
    current: Sequence[dict[str, Any]], proposed: Sequence[Sequence[dict[str, Any]]], max_demos: int
) -> list[dict[str, Any]]:
    """Merge proposed lists (each the current list with some demos added) into one.

    Only additions are merged: a demo that a proposal adds (an input not in `current`)
    may go in; demos a proposal dropped stay unless `add_demo` replaces them. At most
    `room` new demos go in: the free places, and on a full list at most half of it, so a
    candidate changes the demos step by step instead of swapping the whole set at once.
    They are picked one at a time, each time the one whose output is rarest among the
    list and the demos already picked (so a batch of "yes" examples cannot fill the list
    with "yes"), then the one more proposals added, then the first proposed. The result
    depends only on `current` and the order of `proposed`.
    """
    known = {json_key(d["input"]) for d in current}
    support: Counter[str] = Counter()
    first_seen: dict[str, dict[str, Any]] = {}
    for demos in proposed:
        for demo in demos:
            key = json_key(demo["input"])
            if key in known:
                continue
            support[key] += 1
            first_seen.setdefault(key, dict(demo))
    room = max(max_demos - len(current), max(1, max_demos // 2))
    outputs = Counter(json_key(d["output"]) for d in current)
    order = {key: index for index, key in enumerate(first_seen)}
    remaining = list(first_seen)
    picked: list[dict[str, Any]] = []
    while remaining and len(picked) < room:
        key = min(remaining, key=lambda k: (outputs[json_key(first_seen[k]["output"])], -support[k], order[k]))
        remaining.remove(key)
        picked.append(first_seen[key])
        outputs[json_key(first_seen[key]["output"])] += 1
    merged = [dict(d) for d in current]
    for demo in reversed(picked):  # the first picked goes in last, so it is the last replaced
        merged = add_demo(merged, demo, max_demos) or merged
    return merged
