"""One live run per output_dir.

Two runs writing into one output_dir overwrite each other's checkpoints and final model, and both exit 0. While a
run trains (and, from the CLI, saves), its main process holds an OS file lock on `<output_dir>/.ppm_trl_run.lock`
(`filelock`: released by the OS when the process dies, so a crashed run never blocks the next) and names itself in
`.ppm_trl_run.json` (pid, host, start). A second run into the same output_dir is refused with that name. A run that
finds the name of a run that did not clean up (killed, machine lost) takes the directory over and says so. Both files
are removed when the run ends, and never uploaded (`hub.RUN_PRIVATE_FILES`). The lock is advisory and local: a run on
another machine sharing the directory over NFS may not see it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from contextlib import contextmanager

LOCK_FILE = ".ppm_trl_run.lock"
HOLDER_FILE = ".ppm_trl_run.json"
_HELD: dict[str, int] = {}  # real output_dir → depth: the CLI's lock and the trainer's are one in a process


class OutputDirInUse(ValueError):
    """Another live run holds this output_dir (a setting to change: `ppm-trl train` says so in one line, exit 2)."""


@contextmanager
def output_dir_lock(output_dir: str, enabled: bool = True):
    """Hold `output_dir` for this run while in the block (re-entrant within a process; `enabled=False` on the
    processes other than the main one)."""
    if not enabled:
        yield
        return
    os.makedirs(output_dir, exist_ok=True)
    key = os.path.realpath(output_dir)
    if _HELD.get(key):
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    import filelock

    lock = filelock.FileLock(os.path.join(key, LOCK_FILE), timeout=0)
    holder_path = os.path.join(key, HOLDER_FILE)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise OutputDirInUse(f"output_dir {output_dir} is in use by a live run ({_describe(holder_path)}): two runs "
                             "would overwrite each other's checkpoints and model. Use another output_dir, or wait "
                             "for that run to finish") from None
    try:
        previous = _describe(holder_path)
        if previous != "holder unknown":
            print(f"ppm_trl: taking over output_dir {output_dir} from a run that did not end cleanly ({previous}; it "
                  "no longer holds the directory)", file=sys.stderr, flush=True)
        with open(holder_path, "w", encoding="utf-8") as handle:
            json.dump({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}, handle)
        _HELD[key] = 1
        try:
            yield
        finally:
            _HELD.pop(key, None)
            _remove(holder_path)
    finally:
        lock.release()
        _remove(lock.lock_file)


def _describe(holder_path: str) -> str:
    try:
        with open(holder_path, encoding="utf-8") as handle:
            holder = json.load(handle)
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder["started"])))
        return f"pid {int(holder['pid'])} on host {str(holder['host'])[:100]!r}, started {started}"
    except (OSError, ValueError, TypeError, KeyError, OverflowError):
        return "holder unknown"


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
