"""The root of opto's errors.

Every error opto raises on purpose derives from `OptoError`, so `except opto.OptoError`
catches them all. Each also keeps the built-in type it stands for (a bad argument is an
`OptoValueError`, which is a `ValueError`; a `DatasetError` is a `ValueError`; a
`FineTuneError` a `RuntimeError`), so handlers written for the built-in types keep working.
The whole tree, with the model layer's errors, is on the docs site's exceptions page.
"""

from __future__ import annotations

__all__ = [
    "MissingDependencyError",
    "MissingFileError",
    "OptoError",
    "OptoKeyError",
    "OptoTypeError",
    "OptoValueError",
    "RunDirError",
    "RunDirWriteError",
    "UsageError",
]


class OptoError(Exception):
    """Base class of every error opto raises on purpose."""


class OptoValueError(OptoError, ValueError):
    """An argument or setting has a value opto cannot use; the message says which and what to pass."""


class OptoTypeError(OptoError, TypeError):
    """An argument has a type opto cannot use; the message says which and what to pass."""


class OptoKeyError(OptoError, KeyError):
    """A name that is not there: a parameter an agent does not have, a key missing from a file."""

    def __str__(self) -> str:  # KeyError quotes its message; this one is a sentence
        return str(self.args[0]) if self.args else ""


class UsageError(OptoError, RuntimeError):
    """Something was used in an order it does not support (a server stopped before it started)."""


class MissingFileError(OptoError, FileNotFoundError):
    """A file or folder opto was pointed at does not exist."""


class MissingDependencyError(OptoError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""


class RunDirError(OptoError, ValueError):
    """A run directory that cannot be resumed as it is: a damaged or inconsistent file.

    Raised before anything in the folder is changed; the message names the file, the
    field and what to do.
    """


class RunDirWriteError(OptoError, OSError):
    """A write to the run directory failed (disk full, I/O error): the run stopped after
    keeping what it could, and `train(..., resume=True)` continues once the disk is writable."""
