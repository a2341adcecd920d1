"""The Makefile's test selections stay true: every file `make test-lower` (LOWER_TESTS) names exists, so a renamed or
removed test file fails here rather than silently leaving the list; `make test-fast` selects by the `fast` marker."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

REPO = Path(__file__).resolve().parents[2]
MAKEFILE = (REPO / "Makefile").read_text()


def _listed(variable: str) -> list[str]:
    match = re.search(rf"^{variable} \?=((?:.*\\\n)*.*)$", MAKEFILE, re.M)
    assert match, f"the Makefile no longer defines {variable}"
    return match.group(1).replace("\\\n", " ").split()


def test_every_file_the_fast_and_lower_targets_name_exists():
    for variable in ("LOWER_TESTS",):
        files = _listed(variable)
        assert len(files) >= 10, f"{variable}: the pattern found only {files}"
        missing = [name for name in files if not (REPO / name).is_file()]
        assert not missing, f"the Makefile's {variable} names files that do not exist: {missing}"
        assert len(set(files)) == len(files), f"{variable} names a file twice"


def test_the_fast_target_runs_the_fast_marker_and_nothing_slow():
    assert re.search(r'^test-fast: install\n\t.*-m "fast and not slow and not vllm" tests ', MAKEFILE, re.M)
    marked = sorted(str(path.relative_to(REPO)) for path in (REPO / "tests").rglob("test_*.py")
                    if "pytestmark = pytest.mark.fast" in path.read_text(encoding="utf-8"))
    assert len(marked) >= 20, marked
    slow = [name for name in marked if re.search(r"^\s*(pytestmark = |@)pytest\.mark\.slow",
                                                 (REPO / name).read_text(encoding="utf-8"), re.M)]
    assert slow == [], f"marked fast and slow: {slow}"
