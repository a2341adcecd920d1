"""docs/design.md stays true of the code where a test can tell: every file it names exists, and every
`module.name` it cites from ppm_trl is importable."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DESIGN = (REPO / "docs" / "design.md").read_text()
# "Adding a method": the files a reader would write
EXAMPLE_FILES = {"ppm_trl/sign/sign_trainer.py", "ppm_trl/sign/__init__.py", "ppm_trl/sign/sign_config.py"}


def _exists(reference: str) -> bool:
    roots = [REPO, REPO / "ppm_trl", REPO / "ppm_trl" / "trainers", REPO / "tests", REPO / "benchmarks"]
    return any((root / reference).exists() for root in roots)


def test_every_file_the_design_names_exists():
    named = set(re.findall(r"`([\w./-]+\.(?:py|md|yaml|sh))`", DESIGN)) - EXAMPLE_FILES
    assert named, "the pattern found no file reference: it no longer matches the document"
    missing = sorted(reference for reference in named if not _exists(reference))
    assert not missing, f"docs/design.md names files that do not exist: {missing}"


def test_every_ppm_trl_name_the_design_cites_is_importable():
    cited = set(re.findall(r"`(ppm_trl(?:\.\w+)+)`", DESIGN))
    broken = []
    for dotted in sorted(cited):
        module, _, attribute = dotted.rpartition(".")
        try:
            importlib.import_module(dotted)
            continue
        except ImportError:
            pass
        try:
            if not hasattr(importlib.import_module(module), attribute):
                broken.append(dotted)
        except ImportError:
            broken.append(dotted)
    assert not broken, f"docs/design.md cites names that do not exist: {broken}"
