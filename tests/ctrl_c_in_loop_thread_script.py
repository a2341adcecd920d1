"""Ctrl-C that the kernel hands to the judge loop's thread, in a process of its own (tests/judge/test_judge_prepare.py):
`python ctrl_c_in_loop_thread_script.py`. A signal raised inside the pytest process can land after the code under
test returned and kill the whole session (it did under load), so the test runs this and reads its output.

Prints `interrupted: <message>` when `_run_interruptibly` raised `PrepareInterrupted`, then `work finished: <bool>`
(False: the 20 s of work was cancelled, not waited for); exits 0, or 1 when it was not interrupted."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time

from ppm_trl.judge import loop as judge_loop
from ppm_trl.prepare.judging import PrepareInterrupted, _run_interruptibly


def main_thread_waits_in(*functions: str) -> bool:
    """Whether the main thread's stack is inside each of `functions` (by name) right now."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    names = set()
    while frame is not None:
        names.add(frame.f_code.co_name)
        frame = frame.f_back
    return names.issuperset(functions)


def main() -> int:
    loop, thread = judge_loop.judge_loop()
    state = {"started": threading.Event(), "finished": False}

    async def work():
        state["started"].set()
        await asyncio.sleep(20)
        state["finished"] = True

    def interrupt_from_the_loop_thread():
        # Only once the main thread waits on the future: a SIGINT while it is still scheduling the work (the loop
        # may start it before `run_coroutine_threadsafe` returns) is a plain KeyboardInterrupt, not this case.
        state["started"].wait(60)
        deadline = time.monotonic() + 60
        while not main_thread_waits_in("_run_interruptibly", "result") and time.monotonic() < deadline:
            time.sleep(0.01)
        signal.pthread_kill(thread.ident, signal.SIGINT)

    signal.signal(signal.SIGINT, signal.default_int_handler)  # a parent may have left SIGINT ignored
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    threading.Thread(target=interrupt_from_the_loop_thread, daemon=True).start()
    interrupted = None
    try:
        _run_interruptibly(None, work, [2], 20)
    except PrepareInterrupted as caught:
        interrupted = str(caught)
    print(f"interrupted: {interrupted}")
    print(f"work finished: {state['finished']}")
    return 0 if interrupted else 1


if __name__ == "__main__":
    sys.exit(main())
