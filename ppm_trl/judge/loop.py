"""The one background asyncio loop that every judge in a process shares.

LiteLLM keeps process-wide state bound to the first event loop that uses it (its logging worker's queue), so two
judges on two loops break it. All judges therefore run their requests on one daemon thread's loop, started on
first use, restarted in a forked child (a fork copies no threads), and drained at interpreter exit.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_state: dict[str, Any] = {}  # loop, thread, pid
_closers: weakref.WeakSet = weakref.WeakSet()  # objects with `async aclose()` to close before the loop stops


def judge_loop() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """The shared loop and its thread, started if needed."""
    with _lock:
        if not _state or _state["pid"] != os.getpid() or not _state["thread"].is_alive():
            loop = asyncio.new_event_loop()
            started = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                loop.run_forever()

            thread = threading.Thread(target=serve, name="ppm-trl-judge-loop", daemon=True)
            thread.start()
            started.wait()
            if not _state:
                atexit.register(_stop)
            _state.update(loop=loop, thread=thread, pid=os.getpid())
        return _state["loop"], _state["thread"]


def on_judge_loop() -> bool:
    return bool(_state) and threading.current_thread() is _state["thread"]


def run_blocking(coroutine_factory: Callable[[], Awaitable[Any]]) -> Any:
    """Run `coroutine_factory()` on the shared loop and wait for its result (from any thread but the loop's)."""
    loop, _ = judge_loop()
    if on_judge_loop():
        raise RuntimeError("a blocking judge method was called on the judge's own event loop; await the a* method")
    return asyncio.run_coroutine_threadsafe(coroutine_factory(), loop).result()


async def run_async(coroutine_factory: Callable[[], Awaitable[Any]]) -> Any:
    """Await `coroutine_factory()` on the shared loop from any running loop (TRL's, a user's, or the shared one)."""
    loop, _ = judge_loop()
    if asyncio.get_running_loop() is loop:
        return await coroutine_factory()
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine_factory(), loop))


def register_closer(closer: Any) -> None:
    _closers.add(closer)


def close_soon(closer: Any, timeout: float = 10.0) -> None:
    """Run `closer.aclose()` on the shared loop if it is running (best effort)."""
    if not _state or _state["pid"] != os.getpid() or not _state["thread"].is_alive():
        return
    try:
        asyncio.run_coroutine_threadsafe(closer.aclose(), _state["loop"]).result(timeout)
    except Exception as error:  # closing is best effort
        logger.debug("closing %r failed: %s", closer, error)


async def _drain() -> None:
    for closer in list(_closers):
        try:
            await closer.aclose()
        except Exception as error:  # closing is best effort
            logger.debug("closing %r failed: %s", closer, error)
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:  # e.g. LiteLLM's logging worker: cancel it rather than destroy it pending
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()


def _stop() -> None:
    """At interpreter exit: close transports, cancel leftover tasks, stop and close the loop."""
    with _lock:
        if not _state or _state["pid"] != os.getpid() or not _state["thread"].is_alive():
            return
        loop, thread = _state["loop"], _state["thread"]
        try:
            asyncio.run_coroutine_threadsafe(_drain(), loop).result(10)
        except Exception as error:  # closing is best effort
            logger.debug("draining the judge loop failed: %s", error)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        if not thread.is_alive():
            loop.close()
        _state.clear()
