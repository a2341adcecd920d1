"""Identical judge requests sent once across processes that share a cache directory.

Before a process sends a request that is not in the cache, it takes a non-blocking file lock named after the
request key (`filelock`, an OS lock released even when the holder dies). A second process asking for the same key
meanwhile finds the lock held, waits on the event loop (never blocking it) until it is released, and reads the
answer from the cache; if the first process got no answer (unscorable), the second sends the request itself.
Ranks of one `accelerate launch` share `<output_dir>/judge_cache` by default, so a rollout that two ranks both
have (common with short answers) is judged once. Processes on different machines share only through a cache
directory on a shared file system with working locks; elsewhere each machine judges its own copy.

A holder that never finishes (hung, or stopped with SIGSTOP: its OS lock stays held) is waited for at most
`max_wait_seconds` — the judge passes the longest its own request may take (`limits.longest_wait_seconds`) —
then the waiter sends the request itself. The judge claims a key only when the request is about to be sent, so
the locks held at once are bounded by its concurrency, not by the requests queued.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable

import filelock


class KeyClaims:
    """`await claim(key)` → (lock held by this process, whether another process held it first)."""

    def __init__(self, directory: str | os.PathLike, poll_seconds: float = 0.05, max_wait_seconds: float = 600.0,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep):
        if not max_wait_seconds >= 0:  # nan would wait forever
            raise ValueError(f"max_wait_seconds must be >= 0, got {max_wait_seconds!r}")
        self.directory = os.path.join(os.fspath(directory), "claims")
        self.poll_seconds, self.max_wait_seconds = poll_seconds, max_wait_seconds
        self.clock, self.sleep = clock, sleep  # injectable: the wait is tested on a fake clock

    def _lock(self, key: str) -> filelock.BaseFileLock:
        shard = os.path.join(self.directory, key[:2])
        os.makedirs(shard, exist_ok=True)
        return filelock.FileLock(os.path.join(shard, f"{key}.lock"), timeout=0, thread_local=False)

    async def claim(self, key: str) -> tuple[filelock.BaseFileLock | None, bool]:
        """Hold the key's lock (None when the lock cannot be made: the request is then sent unclaimed). A holder
        that takes longer than `max_wait_seconds` (a hung process) is not waited for any longer."""
        try:
            lock = self._lock(key)
        except OSError:
            return None, False
        waited, deadline = False, self.clock() + self.max_wait_seconds
        while True:
            try:
                lock.acquire()
                return lock, waited
            except filelock.Timeout:
                if self.clock() >= deadline:
                    return None, waited
                waited = True
                await self.sleep(min(self.poll_seconds, max(deadline - self.clock(), 0.0)))
            except OSError:
                return None, waited

    @staticmethod
    def release(lock: filelock.BaseFileLock | None) -> None:
        """Release a claim and remove its file (one per request would pile up). A process that opened the file
        before the removal may then hold a lock on the removed file while a third makes a new one: both send the
        request — a rare duplicate request, never a wrong answer."""
        if lock is not None:
            try:
                os.unlink(lock.lock_file)
            except OSError:
                pass
            try:
                lock.release()
            except OSError:
                pass
