"""The root of opto's errors.

Every error opto raises on purpose derives from `OptoError`, so `except opto.OptoError`
catches them all; each also keeps the built-in type it had (a `DatasetError` is still a
`ValueError`, a `FineTuneError` a `RuntimeError`), so existing handlers keep working.
"""

from __future__ import annotations

__all__ = ["OptoError", "RunDirError", "RunDirWriteError"]


class OptoError(Exception):
    """Base class of every error opto raises on purpose."""


class RunDirError(OptoError, ValueError):
    """A run directory that cannot be resumed as it is: a damaged or inconsistent file.

    Raised before anything in the folder is changed; the message names the file, the
    field and what to do.
    """


class RunDirWriteError(OptoError, OSError):
    """A write to the run directory failed (disk full, I/O error): the run stopped after
    keeping what it could, and `train(..., resume=True)` continues once the disk is writable."""
