"""A guard against replies that loop: "the feedback is that the feedback is that ...".

Small local models fall into such loops and fill `max_tokens` with them. Such a reply is
cut where its loop starts and counted as truncated (finish reason "length"), so the
optimizer's reader treats it as the incomplete text it is.
"""

from __future__ import annotations

__all__ = ["cut_repetition"]

# A loop is a unit of 1-120 characters repeated back to back at the end of the reply, at
# least MIN_REPEATS times and over at least MIN_SPAN characters: an ordinary list or a
# repeated word ("very very") stays.
MAX_UNIT = 120
MIN_REPEATS = 4
MIN_SPAN = 48


def cut_repetition(text: str) -> str | None:
    """`text` up to the end of the first occurrence of its trailing loop; None when it has none."""
    tail = text.rstrip()
    for unit in range(1, min(MAX_UNIT, len(tail) // MIN_REPEATS) + 1):
        pattern = tail[-unit:]
        repeats, end = 1, len(tail) - unit
        while end >= unit and tail[end - unit : end] == pattern:
            repeats, end = repeats + 1, end - unit
        # The loop may end inside a unit (cut by the token limit): count whole units only.
        if repeats >= MIN_REPEATS and repeats * unit >= MIN_SPAN:
            return tail[: end + unit]
    return None
