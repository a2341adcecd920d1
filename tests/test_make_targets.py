"""The Makefile's test file lists stay true: every file `make test-fast` (FAST_TESTS) and `make test-lower`
(LOWER_TESTS) names exists, so a renamed or removed test file fails here rather than silently leaving the list."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAKEFILE = (REPO / "Makefile").read_text()


def _listed(variable: str) -> list[str]:
    match = re.search(rf"^{variable} \?=((?:.*\\\n)*.*)$", MAKEFILE, re.M)
    assert match, f"the Makefile no longer defines {variable}"
    return match.group(1).replace("\\\n", " ").split()


def test_every_file_the_fast_and_lower_targets_name_exists():
    for variable in ("FAST_TESTS", "LOWER_TESTS"):
        files = _listed(variable)
        assert len(files) >= 10, f"{variable}: the pattern found only {files}"
        missing = [name for name in files if not (REPO / name).is_file()]
        assert not missing, f"the Makefile's {variable} names files that do not exist: {missing}"
        assert len(set(files)) == len(files), f"{variable} names a file twice"


def test_the_fast_target_runs_nothing_slow():
    assert re.search(r'^test-fast: install\n\t.*-m "not slow and not vllm" \$\(FAST_TESTS\)', MAKEFILE, re.M)
