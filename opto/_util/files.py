"""Crash-safe file writes: whole files by rename, appends by fsync, torn tails repaired.

Both kinds are all-or-nothing: a whole-file write that fails leaves the old file, and an
append that fails (ENOSPC, EIO, at any byte) is cut back to where it began, so a reader
never sees part of a failed write as records.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from ..errors import OptoValueError
from .redaction import redact

__all__ = [
    "append_jsonl",
    "atomic_write_json",
    "atomic_write_jsonl",
    "atomic_write_text",
    "json_key",
    "read_jsonl",
    "remove_stale_temp_files",
    "repair_jsonl",
    "to_json_line",
]

logger = logging.getLogger(__name__)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write a file so that readers see the old or the new content, never a torn one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_temp_prefix(path), suffix=".tmp")
    try:
        try:
            _write(fd, text.encode("utf-8"))
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _temp_prefix(path: Path) -> str:
    return f".{path.name}."


def remove_stale_temp_files(path: str | Path) -> list[Path]:
    """Remove the temp files an interrupted `atomic_write_*` of `path` left (a `kill -9`
    between writing and renaming); returns those removed."""
    path = Path(path)
    removed = []
    for stale in path.parent.glob(f"{_temp_prefix(path)}*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
            removed.append(stale)
    return removed


def _write(fd: int, data: bytes) -> None:
    """Write all of `data` and fsync: the one place run files are written (unbuffered, so
    nothing of a failed write is flushed later; tests make it fail on purpose)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.fsync(fd)


def to_json_line(value: Any, *, indent: int | None = None) -> str:
    """`value` as JSON text that can always be written as UTF-8.

    Text stays readable (no `\\u` escapes) unless it holds a lone surrogate (a broken
    escape in a model reply), which UTF-8 cannot encode: then the record is escaped
    as ASCII, which `json.loads` reads back to the very same string.
    """
    text = json.dumps(value, indent=indent, ensure_ascii=False, default=str)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(value, indent=indent, ensure_ascii=True, default=str)
    return redact(text)  # the last line of defence: no API key opto knows is ever written


def json_key(value: Any) -> str:
    """A stable identity for a JSON-like value (keys sorted): for de-duplication and caches."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def atomic_write_json(path: str | Path, value: Any) -> None:
    atomic_write_text(path, to_json_line(value, indent=2) + "\n")


def _jsonl(records: list[dict[str, Any]]) -> str:
    return "".join(to_json_line(r) + "\n" for r in records)


def atomic_write_jsonl(path: str | Path, records: list[dict[str, Any]]) -> None:
    """Replace a JSONL file atomically."""
    atomic_write_text(path, _jsonl(records))


def append_jsonl(path: str | Path, records: list[dict[str, Any]]) -> None:
    """Append whole lines and fsync: all of them, or (on any error) none.

    A failed append is cut back to the file's size before it, so no part of it can be
    read as records; a crash (no chance to cut back) leaves at most a torn last line,
    which the next append, or `repair_jsonl`, cuts off first, so new records never get
    glued onto it.
    """
    if not records:
        return
    data = _jsonl(records).encode("utf-8")
    repair_jsonl(path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.fstat(fd).st_size
        try:
            _write(fd, data)
        except BaseException:
            _cut_back(fd, start, path)
            raise
    finally:
        os.close(fd)


def _cut_back(fd: int, size: int, path: str | Path) -> None:
    """Undo a failed append; if even that fails, the caller's record of what is written
    (the run's checkpoint) must not count it, and `repair_jsonl` handles a torn tail."""
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    except OSError as exc:
        logger.error("%s: could not cut back a failed append (%s); its partial records stay until resume", path, exc)


def repair_jsonl(path: str | Path) -> bool:
    """Make a JSONL file end on a whole line; True if it had to be repaired.

    A last line with no newline (from a crash mid-append) is cut off, unless it is a
    complete JSON record, which then only gets its newline (as `read_jsonl` reads it).
    Complete lines before it are never touched.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    if size == 0:
        return False
    with open(path, "rb+") as handle:
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) == b"\n":
            return False
        keep = _last_line_start(handle, size)
        handle.seek(keep)
        tail = handle.read()
        if _is_json(tail):
            handle.write(b"\n")
            action = "added the missing newline after the last record"
        else:
            handle.truncate(keep)
            action = f"removed a torn last line ({size - keep} bytes)"
        handle.flush()
        os.fsync(handle.fileno())
    logger.warning("%s: %s, left by an interrupted write", path, action)
    return True


def _last_line_start(handle: Any, size: int) -> int:
    """Offset just after the last newline (0 when there is none), reading back in blocks."""
    end = size
    while end > 0:
        start = max(0, end - 65536)
        handle.seek(start)
        cut = handle.read(end - start).rfind(b"\n")
        if cut != -1:
            return start + cut + 1
        end = start
    return 0


def _is_json(data: bytes) -> bool:
    try:
        json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return False
    return True


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every complete record; a torn last line (from a crash mid-append) is ignored."""
    records: list[dict[str, Any]] = []
    path = Path(path)
    if not path.exists():
        return records
    # Split on "\n" only: records may hold U+2028 and other breaks that splitlines() cuts at.
    lines = path.read_text(encoding="utf-8").split("\n")
    while lines and not lines[-1]:
        lines.pop()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise OptoValueError(f"{path}:{number} is not valid JSON") from None
    return records
