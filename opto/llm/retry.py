"""Backoff delays: exponential with jitter, or what the server's Retry-After asks."""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Mapping

__all__ = [
    "CONNECT_BACKOFF_BASE",
    "CONNECT_BACKOFF_CAP",
    "CONNECT_RETRIES",
    "backoff_delay",
    "retry_after_delay",
    "retry_after_seconds",
]

MAX_RETRY_AFTER = 120.0

# A server that refuses connections, a host name that does not resolve or a TLS failure is
# almost always a wrong URL or a server that is not running: a few quick retries ride out a
# restart (at most 0.5 + 1 + 2 s of waiting), then the caller is told where it could not connect.
CONNECT_RETRIES = 3
CONNECT_BACKOFF_BASE = 0.5
CONNECT_BACKOFF_CAP = 2.0


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    """Seconds the server asked us to wait (retry-after-ms, Retry-After seconds or date)."""
    if not headers:
        return None
    value = headers.get("retry-after-ms")
    if value:
        try:
            return min(MAX_RETRY_AFTER, max(0.0, float(value) / 1000))
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return min(MAX_RETRY_AFTER, max(0.0, float(value)))
    except ValueError:
        pass
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return min(MAX_RETRY_AFTER, max(0.0, parsed.timestamp() - time.time()))


def backoff_delay(attempt: int, base: float = 0.5, cap: float = 30.0, rng: random.Random | None = None) -> float:
    """Exponential backoff with jitter: half fixed, half random, so clients spread out."""
    ceiling = min(cap, base * (2**attempt))
    return ceiling / 2 + (rng or random).uniform(0, ceiling / 2)


def retry_after_delay(retry_after: float | None, attempt: int, rng: random.Random | None = None) -> float:
    """How long to wait after a refusal: what Retry-After asks (or the backoff when it asks
    nothing) plus a random share of up to half of it, so that the requests a server
    refused at one moment do not all come back at the same instant."""
    base = backoff_delay(attempt, rng=rng) if retry_after is None else retry_after
    return base + (rng or random).uniform(0, max(0.05, base / 2))
