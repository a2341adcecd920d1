"""No test raises a signal into the pytest process itself (issue 34 item 4): a SIGINT that lands after the code
under test returned — late, as it does on a loaded machine — interrupts the whole session (`KeyboardInterrupt`
inside pytest). Such cases run in a child process (a helper script under tests/, e.g.
`ctrl_c_in_loop_thread_script.py`) and assert on its output and exit code; signals sent to a child are fine."""

from __future__ import annotations

import ast
import pathlib

TESTS = pathlib.Path(__file__).resolve().parents[1]
# Calls that deliver a signal to the calling process (or one of its threads).
TO_THIS_PROCESS = {("signal", "pthread_kill"), ("signal", "raise_signal"), ("signal", "alarm"),
                   ("signal", "setitimer"), ("_thread", "interrupt_main")}


def _dotted(node: ast.AST) -> tuple[str, str] | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.value.id, node.attr
    return None


def signals_into_this_process(source: str) -> list[int]:
    """Line numbers of calls in `source` that signal its own process: the calls above, and `os.kill(os.getpid(), …)`."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        called = _dotted(node.func)
        own_pid = (called == ("os", "kill") and node.args and isinstance(node.args[0], ast.Call)
                   and _dotted(node.args[0].func) == ("os", "getpid"))
        if called in TO_THIS_PROCESS or own_pid:
            lines.append(node.lineno)
    return lines


def test_the_detector_finds_each_way_of_signalling_this_process():
    source = ("import os, signal, _thread\nsignal.pthread_kill(t, signal.SIGINT)\nos.kill(os.getpid(), 2)\n"
              "signal.raise_signal(2)\n_thread.interrupt_main()\nos.kill(child.pid, 2)\nprocess.send_signal(2)\n")
    assert signals_into_this_process(source) == [2, 3, 4, 5]


def test_no_test_module_signals_the_pytest_process():
    offenders = {path.name: signals_into_this_process(path.read_text(encoding="utf-8"))
                 for path in sorted(TESTS.rglob("test_*.py"))}
    assert {name: lines for name, lines in offenders.items() if lines} == {}
