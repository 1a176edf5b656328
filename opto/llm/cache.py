"""A persistent response cache in sqlite3 (standard library)."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any, NamedTuple

from .types import ToolCall

__all__ = ["CachedSample", "ResponseCache", "request_key"]


def request_key(request: dict[str, Any], sample_index: int) -> str:
    """sha256 of the full request and the sample index.

    The index keeps the n samples of one request (and repeated sampling at temperature
    > 0) apart, so they are not collapsed into one cached answer.
    """
    payload = json.dumps({"request": request, "sample": sample_index}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


class CachedSample(NamedTuple):
    """One cached sample: its text, finish reason, tool calls and token logprobs."""

    text: str
    finish_reason: str | None
    tool_calls: list[ToolCall]
    logprobs: list[dict[str, Any]]


class ResponseCache:
    """Maps a request key to one sample's text, finish reason and tool calls.

    Safe to share between models and threads; every write is committed at once, so
    what was paid for survives a crash.
    """

    def __init__(self, path: str | Path) -> None:
        self._open(Path(path))

    def __getstate__(self) -> dict[str, Any]:
        return {"path": str(self.path)}  # another process opens the same file (same machine or shared disk)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._open(Path(state["path"]))

    def _open(self, path: Path) -> None:
        self.path = path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, text TEXT NOT NULL, finish_reason TEXT)"
        )
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(responses)")}
        if "tool_calls" not in columns:  # a cache file written before tool calls were cached
            self._db.execute("ALTER TABLE responses ADD COLUMN tool_calls TEXT")
        if "logprobs" not in columns:  # ... or before logprobs were
            self._db.execute("ALTER TABLE responses ADD COLUMN logprobs TEXT")
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> CachedSample | None:
        """The cached sample of `key`, or None."""
        with self._lock:
            row = self._db.execute(
                "SELECT text, finish_reason, tool_calls, logprobs FROM responses WHERE key = ?", (key,)
            ).fetchone()
            if row is None:
                self.misses += 1
                return None
            self.hits += 1
        calls = [ToolCall.model_validate(call) for call in json.loads(row[2])] if row[2] else []
        return CachedSample(row[0], row[1], calls, json.loads(row[3]) if row[3] else [])

    def put(
        self,
        key: str,
        text: str,
        finish_reason: str | None,
        tool_calls: list[ToolCall] | None = None,
        logprobs: list[dict[str, Any]] | None = None,
    ) -> None:
        calls = json.dumps([call.model_dump() for call in tool_calls]) if tool_calls else None
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO responses (key, text, finish_reason, tool_calls, logprobs) "
                "VALUES (?, ?, ?, ?, ?)",
                (key, text, finish_reason, calls, json.dumps(logprobs) if logprobs else None),
            )

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()
