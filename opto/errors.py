"""The root of opto's errors.

Every error opto raises on purpose derives from `OptoError`, so `except opto.OptoError`
catches them all; each also keeps the built-in type it had (a `DatasetError` is still a
`ValueError`, a `FineTuneError` a `RuntimeError`), so existing handlers keep working.
"""

from __future__ import annotations

__all__ = ["OptoError"]


class OptoError(Exception):
    """Base class of every error opto raises on purpose."""
