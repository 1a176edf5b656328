"""Keeping API keys out of every file and log line, even when a server echoes one back.

Every key opto resolves is remembered here (in memory only). Error text from a server
is passed through `redact` before it becomes an exception message or a log line, and
every JSON file opto writes goes through it too, as a last line of defence.
"""

from __future__ import annotations

import threading

__all__ = ["REDACTED", "redact", "remember_secret"]

REDACTED = "[REDACTED]"
_MIN_LENGTH = 8  # shorter strings are not keys, and replacing them would mangle text

_secrets: tuple[str, ...] = ()  # longest first: a key that contains another is replaced first
_lock = threading.Lock()


def remember_secret(secret: str | None) -> None:
    """Redact `secret` from now on (placeholders and short strings are ignored)."""
    global _secrets
    if secret and len(secret) >= _MIN_LENGTH:
        with _lock:
            if secret not in _secrets:
                _secrets = tuple(sorted((*_secrets, secret), key=len, reverse=True))


def redact(text: str) -> str:
    """`text` with every remembered secret replaced by `REDACTED`."""
    if not _secrets or not text:
        return text
    for secret in _secrets:  # a tuple replaced whole, so reading it needs no lock
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text
