"""Persistent on-disk cache of judge answers: one JSON file per request key.

A file per key (sharded by the first two hex digits) written to a temporary name and moved into place with
`os.replace` is atomic on POSIX, so any number of processes — training ranks, a `prepare` run and its resumed
successor — can share one cache directory (even on a network file system, where SQLite's locking is not safe).
Two writers of the same key write the same answer for the same request, so the last rename winning is harmless.

The key is the sha256 of the request's fingerprint (model, api_base, transport, messages hash, sampling
parameters), and every entry stores that fingerprint: a read checks that the stored fingerprint hashes to the key
it was read under, so a file copied, planted or left by another version is ignored (counted and warned about
once), never trusted. Two servers behind one model string therefore never share answers.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

CACHE_FORMAT = 2  # 1: key without api_base/transport, no stored fingerprint (those files are never read: misses)
DISABLED = "none"  # `judge_cache_dir: none`: no cache


class CacheDirectoryError(ValueError):
    """The cache directory cannot be created or written (a usage error: one line, before any request)."""


def check_cache_directory(directory: str) -> None:
    """Create `directory` if needed and check that a file can be written there; `CacheDirectoryError` otherwise,
    naming the path, the system's reason and the fix (a missing cache on a read-only file system would
    otherwise be a traceback, and an unwritable one a warning per answer)."""
    fix = f"pass a writable directory as judge_cache_dir (prepare: --cache-dir), or `{DISABLED}` to cache nothing"
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        raise CacheDirectoryError(f"judge cache directory {directory!r}: cannot create it "
                                  f"({error.strerror or error}); {fix}") from None
    probe = os.path.join(directory, f".write-check-{os.getpid()}-{threading.get_ident()}")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666))
        os.unlink(probe)
    except OSError as error:
        raise CacheDirectoryError(f"judge cache directory {directory!r}: cannot write to it "
                                  f"({error.strerror or error}); {fix}") from None


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=repr)


def request_fingerprint(model: str, api_base: str | None, transport: str, messages: list[dict[str, Any]],
                        params: dict[str, Any]) -> dict[str, Any]:
    """What identifies a judge request: where it goes, how, and the exact messages and sampling parameters.
    JSON-normalised (tuples become lists, unknown objects their repr), so it reads back from a file unchanged."""
    messages_sha256 = hashlib.sha256(_canonical(messages).encode("utf-8")).hexdigest()
    return {"format": CACHE_FORMAT, "model": model, "api_base": api_base, "transport": transport,
            "messages_sha256": messages_sha256, "params": json.loads(_canonical(params))}


def request_key(fingerprint: dict[str, Any]) -> str:
    """The cache key of a `request_fingerprint`: its sha256."""
    return hashlib.sha256(_canonical(fingerprint).encode("utf-8")).hexdigest()


class ResponseCache:
    """`get(key)` returns a verified entry or None; `on_reject()` is called for each entry refused on read.

    The directory is created and test-written at construction (`CacheDirectoryError`: one clear line). A write
    that fails later (disk full, permissions changed) loses that entry only: `put_many` reports it to its caller,
    logs the 1st to 10th failure and then every 100th (a volume that went read-only must not print a warning per
    answer), and calls `on_write_error()` for each (the judge counts them: `cache_write_failures`)."""

    def __init__(self, directory: str | os.PathLike, on_reject: Callable[[], None] | None = None,
                 on_write_error: Callable[[], None] | None = None):
        self.directory = os.fspath(directory)
        check_cache_directory(self.directory)
        self.on_reject = on_reject
        self.on_write_error = on_write_error
        self.rejected = 0
        self.write_failures = 0
        self._shards: set[str] = set()

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, key[:2], f"{key}.json")

    def get(self, key: str) -> dict[str, Any] | None:
        path = self._path(key)
        try:
            with open(path, encoding="utf-8") as handle:
                entry = json.load(handle)
        except OSError:  # absent (a miss) or unreadable: the next answer overwrites it
            return None
        except ValueError:  # not JSON: writes are atomic, so this file is not one of ours
            entry = None
        if (isinstance(entry, dict) and isinstance(entry.get("content"), str)
                and isinstance(entry.get("request"), dict) and request_key(entry["request"]) == key):
            return entry
        self._reject(path)
        return None

    def _reject(self, path: str) -> None:
        self.rejected += 1
        if self.rejected == 1:
            logger.warning(
                "judge cache %s: ignored %s, whose stored request does not match its key (planted, copied or "
                "written by another version); such entries are re-asked and overwritten, and counted in the "
                "judge's cache_rejected statistic", self.directory, path,
            )
        if self.on_reject is not None:
            self.on_reject()

    def put(self, key: str, entry: dict[str, Any]) -> None:
        path = self._path(key)
        shard = os.path.dirname(path)
        if shard not in self._shards:
            os.makedirs(shard, exist_ok=True)
            self._shards.add(shard)
        # Unique per process and thread, so concurrent writers never share a temporary file.
        temporary = os.path.join(shard, f".tmp-{os.getpid()}-{threading.get_ident()}-{key}")
        data = json.dumps(entry, ensure_ascii=False).encode("utf-8")  # one write, not json.dump's many small ones
        try:
            handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)  # as open() does
            try:
                view = memoryview(data)
                while view:  # os.write may write less than asked
                    view = view[os.write(handle, view) :]
            finally:
                os.close(handle)
            os.replace(temporary, path)
        except BaseException:
            if os.path.exists(temporary):
                os.unlink(temporary)
            raise

    def put_many(self, entries: list[tuple[str, dict[str, Any]]]) -> list[OSError | None]:
        """Write several entries; per entry, the OSError that kept it out of the cache, or None."""
        errors: list[OSError | None] = []
        for key, entry in entries:
            try:
                self.put(key, entry)
                errors.append(None)
            except OSError as error:
                errors.append(error)
                self._write_failed(error)
        return errors

    def _write_failed(self, error: OSError) -> None:
        self.write_failures += 1
        count = self.write_failures
        if count <= 10 or count % 100 == 0:  # as the judge's own failures: a broken volume must not flood the log
            logger.warning("judge cache write to %s failed (answer kept, not cached; write failure #%d%s): %s",
                           self.directory, count, ", only every 100th is logged from now on" if count == 10 else "",
                           error)
        if self.on_write_error is not None:
            self.on_write_error()

    def __len__(self) -> int:
        return sum(
            name.endswith(".json")
            for _, _, names in os.walk(self.directory)
            for name in names
        )

    def __repr__(self) -> str:
        return f"ResponseCache({self.directory!r})"


class CacheWriter:
    """Cache writes from the event loop, batched: one executor job writes every entry gathered meanwhile.

    An executor job per answer cost a thread hand-off and a loop wake-up per request, and each job's thread
    fought the busy loop thread for the GIL around every file operation. Entries therefore wait up to `delay`
    seconds (or until `max_pending` of them, or `flush()`: the end of a batch, whose caller waits for its answers
    to be on disk) and are written together. Writing while requests are in flight, rather than all at the end,
    hides the file system's time (creating and renaming a file costs from ~30 µs to ~0.5 ms of kernel CPU, e.g.
    on a busy ext4 volume) behind the network wait. File I/O stays off the loop thread, so a slow (e.g. network)
    file system does not stall it. Until written, an entry is served from memory (`get`).
    """

    def __init__(self, cache: ResponseCache, delay: float = 0.05, max_pending: int = 256):
        self.cache = cache
        self.delay = delay
        self.max_pending = max_pending
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[tuple[str, dict[str, Any], asyncio.Future]] = []
        self._unwritten: dict[str, dict[str, Any]] = {}  # queued or being written: readable through `get`
        self._now: asyncio.Event | None = None  # set by flush() or max_pending: write without waiting `delay`
        self._task: asyncio.Task | None = None  # the writer: runs while entries are pending

    def get(self, key: str) -> dict[str, Any] | None:
        """An entry not yet on disk, else the cache's (so a concurrent batch sees answers as soon as they exist)."""
        entry = self._unwritten.get(key)
        return entry if entry is not None else self.cache.get(key)

    def _bind(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # first use, or a forked child's new loop: the old queue is not ours
            self._loop, self._pending, self._unwritten, self._task = loop, [], {}, None
            self._now = asyncio.Event()
        return loop

    def put(self, key: str, entry: dict[str, Any]) -> asyncio.Future:
        """Queue an entry; the future resolves once it is written: to None, or to the OSError that lost it."""
        loop = self._bind()
        done = loop.create_future()
        self._pending.append((key, entry, done))
        self._unwritten[key] = entry
        if len(self._pending) >= self.max_pending:
            self._now.set()
        if self._task is None:
            self._task = loop.create_task(self._write())
        return done

    def flush(self) -> None:
        """Write every pending entry now (after the write in progress, if any)."""
        self._bind()
        if self._pending:
            self._now.set()

    async def _write(self) -> None:
        try:
            while self._pending:
                try:
                    await asyncio.wait_for(self._now.wait(), self.delay)
                except TimeoutError:
                    pass
                self._now.clear()
                batch, self._pending = self._pending, []
                try:
                    errors = await asyncio.to_thread(self.cache.put_many, [(key, entry) for key, entry, _ in batch])
                except BaseException as error:  # a bug (or the loop shutting down): tell every waiter
                    for _, _, done in batch:
                        if not done.done():
                            done.set_exception(error)
                    raise
                for (key, entry, done), error in zip(batch, errors):
                    if self._unwritten.get(key) is entry:
                        del self._unwritten[key]
                    if not done.done():  # its waiter may have been cancelled
                        done.set_result(error)
        finally:
            self._task = None
