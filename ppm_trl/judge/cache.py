"""Persistent on-disk cache of judge answers: one JSON file per request key.

A file per key (sharded by the first two hex digits) written to a temporary name and moved into place with
`os.replace` is atomic on POSIX, so any number of processes — training ranks, a `prepare` run and its resumed
successor — can share one cache directory (even on a network file system, where SQLite's locking is not safe).
Two writers of the same key write the same answer for the same request, so the last rename winning is harmless.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from typing import Any

CACHE_FORMAT = 1


def request_key(model: str, messages: list[dict[str, Any]], params: dict[str, Any]) -> str:
    """sha256 of the exact request: model, messages and the sampling parameters that shape the answer."""
    canonical = json.dumps(
        {"format": CACHE_FORMAT, "model": model, "messages": messages, "params": params},
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
        default=repr,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class ResponseCache:
    def __init__(self, directory: str | os.PathLike):
        self.directory = os.fspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        self._shards: set[str] = set()

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, key[:2], f"{key}.json")

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            with open(self._path(key), encoding="utf-8") as handle:
                entry = json.load(handle)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return None  # a torn or foreign file is a miss; the next answer overwrites it
        return entry if isinstance(entry, dict) and isinstance(entry.get("content"), str) else None

    def put(self, key: str, entry: dict[str, Any]) -> None:
        path = self._path(key)
        shard = os.path.dirname(path)
        if shard not in self._shards:
            os.makedirs(shard, exist_ok=True)
            self._shards.add(shard)
        # Unique per process and thread, so concurrent writers never share a temporary file.
        temporary = os.path.join(shard, f".tmp-{os.getpid()}-{threading.get_ident()}-{key}")
        try:
            with open(temporary, "w", encoding="utf-8") as handle:
                json.dump(entry, handle, ensure_ascii=False)
            os.replace(temporary, path)
        except BaseException:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise

    def __len__(self) -> int:
        return sum(
            name.endswith(".json")
            for _, _, names in os.walk(self.directory)
            for name in names
        )

    def __repr__(self) -> str:
        return f"ResponseCache({self.directory!r})"
