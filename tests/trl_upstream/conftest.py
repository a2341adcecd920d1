"""TRL's own GRPO tests against our trainers: the hooks and fixtures are harness.py's (see its docstring)."""

from .harness import (  # noqa: F401  (pytest finds hooks and fixtures by their names in this module)
    _offline_hub,
    pytest_collection_finish,
    pytest_collection_modifyitems,
    pytest_generate_tests,
    pytest_pyfunc_call,
    pytest_runtest_makereport,
    pytest_terminal_summary,
    trl_method,
)
