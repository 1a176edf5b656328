"""Token counts read from outside opto (HTTP replies, SDK responses, OpenTelemetry spans).

A backend, an instrumentor or a server can report anything: a negative count would
lower a run's usage and refund a `Budget(max_tokens=...)`, a string or a fraction would
break the sums. `reported_tokens` takes a count only when it is a non-negative whole
number; anything else is ignored, counted by source, and warned about (the first time
for each source, then at 10, 100, ... of them, so a flood of bad spans cannot flood the log).
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from typing import Any

from .types import TokenUsage

__all__ = ["ignored_token_counts", "reported_tokens", "reported_usage"]

logger = logging.getLogger(__name__)

_ignored: Counter[str] = Counter()
_lock = threading.Lock()


def reported_tokens(value: Any, *, field: str, source: str) -> int | None:
    """`value` as a token count, or None when it is missing or not a non-negative whole
    number (then counted and warned about: `source` says who reported it)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, float) and math.isfinite(value) and value >= 0 and value.is_integer():
        return int(value)
    with _lock:
        _ignored[source] += 1
        count = _ignored[source]
    if math.log10(count).is_integer():
        logger.warning(
            "ignored an invalid token count from %s: %s=%r (a count must be a whole number >= 0); "
            "%d ignored from %s so far",
            source,
            field,
            value,
            count,
            source,
        )
    return None


def reported_usage(prompt_tokens: Any, completion_tokens: Any, *, source: str) -> TokenUsage:
    """A `TokenUsage` from reported counts; an invalid or missing count is 0."""
    return TokenUsage(
        prompt_tokens=reported_tokens(prompt_tokens, field="prompt_tokens", source=source) or 0,
        completion_tokens=reported_tokens(completion_tokens, field="completion_tokens", source=source) or 0,
    )


def ignored_token_counts() -> dict[str, int]:
    """How many invalid token counts each source reported so far (in this process)."""
    with _lock:
        return dict(_ignored)
