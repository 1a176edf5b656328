"""Crash-safe file writes: whole files by rename, appends by fsync."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["append_jsonl", "atomic_write_json", "atomic_write_jsonl", "atomic_write_text", "read_jsonl"]


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write a file so that readers see the old or the new content, never a torn one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str | Path, value: Any) -> None:
    atomic_write_text(path, json.dumps(value, indent=2, ensure_ascii=False, default=str) + "\n")


def _jsonl(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in records)


def atomic_write_jsonl(path: str | Path, records: list[dict[str, Any]]) -> None:
    """Replace a JSONL file atomically."""
    atomic_write_text(path, _jsonl(records))


def append_jsonl(path: str | Path, records: list[dict[str, Any]]) -> None:
    """Append whole lines and fsync, so a crash loses at most a torn last line."""
    if not records:
        return
    text = _jsonl(records)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every complete record; a torn last line (from a crash mid-append) is ignored."""
    records = []
    path = Path(path)
    if not path.exists():
        return records
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number} is not valid JSON") from None
    return records
