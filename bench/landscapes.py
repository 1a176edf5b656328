"""Simulated tasks where search matters, shared by `bench/search.py` and its GEPA rows.

A landscape: examples of K classes ("c3 item 7"); the agent has one text parameter per
part, each a list of rules ("c1=good.k2x; c0=fair.9qa") for the part's classes, of which
the agent reads only the first `room` (a rule pushed past them is cut off, so rules
compete for room). On an example of class c the agent is right with the probability its
rule for c gives: good 0.95, fair 0.6, bad 0.1, no rule 0.3. Which items a rule gets
right is fixed by a hash of the rule's text and the item (a temperature-0 model: the same
prompt gives the same answers), so two "good" rules differ in detail, as real prompts do.

The scripted optimizer, whatever prompt it reads (opto's per-instance or reflective
prompt, GEPA's reflection prompt): shown failures, it fixes the first one it may (a class
of a parameter it is asked to change) by writing a rule for that class at the front of its
part: good with probability `good`, else fair; with probability `breaks` it also rewrites
another rule of the part as bad (a fix that breaks something else). Shown no failure it
may fix, it proposes nothing. Its draws are fixed by the run's seed, the current text and
the failures the prompt shows: like a temperature-0 model, the same prompt gets the same
answer, another prompt another. One scripted behaviour, so opto and GEPA face the same
optimizer.
"""

from __future__ import annotations

import hashlib
import random
import re
import statistics
from dataclasses import dataclass
from typing import Any

ACCURACY = {"good": 0.95, "fair": 0.6, "bad": 0.1, None: 0.3}
RULE = re.compile(r"c(\d+)=(good|fair|bad)\.(\w+)")
ITEM = re.compile(r"c(\d+) item (\d+)")

Rules = list[tuple[int, str, str]]


@dataclass(frozen=True)
class Landscape:
    name: str
    parts: dict[str, tuple[int, ...]]  # parameter name -> the classes its rules cover
    room: int  # rules the agent reads of each part
    good: float  # the optimizer's chance of writing a good rule (else fair)
    breaks: float  # its chance of also breaking another rule of the part
    train_per_class: int = 8
    val_per_class: int = 4

    @property
    def classes(self) -> int:
        return sum(len(c) for c in self.parts.values())

    @property
    def attainable(self) -> float:
        """The best expected score: `room` good rules in each part, the other classes ruleless."""
        good = sum(min(self.room, len(c)) for c in self.parts.values())
        return (good * ACCURACY["good"] + (self.classes - good) * ACCURACY[None]) / self.classes

    def part_of(self, c: int) -> str:
        return next(name for name, classes in self.parts.items() if c in classes)

    def read_rules(self, values: dict[str, str]) -> dict[int, tuple[str, str]]:
        """The rules the agent reads: the first `room` of each part, the first of a class winning."""
        seen: dict[int, tuple[str, str]] = {}
        for name, text in values.items():
            for c, quality, tag in rules_of(text)[: self.room]:
                if c in self.parts.get(name, ()):
                    seen.setdefault(c, (quality, tag))
        return seen

    def expected_score(self, values: dict[str, str], examples: list[dict[str, Any]]) -> float:
        rules = self.read_rules(values)
        return statistics.fmean(ACCURACY[rules.get(e["class"], (None,))[0]] for e in examples)

    def answer(self, values: dict[str, str], x: str) -> str:
        """The agent's reply to input x under these values."""
        rules = self.read_rules(values)
        c, item = map(int, ITEM.search(x).groups())
        quality, tag = rules.get(c, (None, ""))
        return f"answer-c{c}-{item}" if unit(quality, tag, c, item) < ACCURACY[quality] else "wrong"

    def fix(self, current: str, c: int, seed: int, shown: Any) -> str:
        """The optimizer's rewrite of a part's text for a failure on class c; `shown` is
        everything else its prompt showed (a temperature-0 model: the same prompt, the same
        answer; another prompt, another draw)."""
        rng = random.Random(f"{seed}|{current}|{c}|{shown}")
        rules = [r for r in rules_of(current) if r[0] != c]
        quality = "good" if rng.random() < self.good else "fair"
        if rules and rng.random() < self.breaks:
            victim = rng.randrange(len(rules))
            rules[victim] = (rules[victim][0], "bad", f"{rng.randrange(10**6):x}")
        rules.insert(0, (c, quality, f"{rng.randrange(10**6):x}"))
        return prompt_of(rules)

    def reflect(self, current: dict[str, str], failures: list[tuple[int, int]], seed: int) -> dict[str, str]:
        """A reflective proposal: fix the first failure of a class in a part the optimizer
        may change (`current` holds those parts' texts); {} when there is none."""
        for c, _ in failures:
            name = self.part_of(c)
            if name in current:
                return {name: self.fix(current[name], c, seed, failures)}
        return {}

    def dataset(self, per_class: int, offset: int) -> list[dict[str, Any]]:
        return [{"x": f"c{c} item {offset + i}", "info": f"answer-c{c}-{offset + i}", "id": f"c{c}-{offset + i}",
                 "class": c} for c in range(self.classes) for i in range(per_class)]

    def train_set(self) -> list[dict[str, Any]]:
        return self.dataset(self.train_per_class, 0)

    def validation_set(self) -> list[dict[str, Any]]:
        return self.dataset(self.val_per_class, 100)


LANDSCAPES = {
    # Six classes in two parameters; a good rule half the time, a quarter of fixes break another rule.
    "two-part": Landscape("two-part", {"rules_a": (0, 1, 2), "rules_b": (3, 4, 5)}, room=2, good=0.5, breaks=0.25),
    # Eight classes in three parameters; an optimizer right less often that breaks more.
    "three-part": Landscape("three-part", {"rules_a": (0, 1, 2), "rules_b": (3, 4, 5), "rules_c": (6, 7)}, room=2,
                            good=0.35, breaks=0.4),
}


def rules_of(prompt: str) -> Rules:
    return [(int(c), quality, tag) for c, quality, tag in RULE.findall(prompt)]


def prompt_of(rules: Rules) -> str:
    return "; ".join(f"c{c}={quality}.{tag}" for c, quality, tag in rules)


def unit(*parts: Any) -> float:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def failures_in(text: str) -> list[tuple[int, int]]:
    """(class, item) of every failed example a prompt shows, in order: an example is a
    block with an input "cN item M" and a score of 0."""
    found = []
    for block in re.split(r"\n#+ Example \d+", text)[1:]:
        item = ITEM.search(block)
        if item and re.search(r"score: 0(\.0)?\b", block):
            found.append((int(item.group(1)), int(item.group(2))))
    return found
