"""docs/design.md stays true of the code where a test can tell: every file it names exists, and every
`module.name` it cites resolves, in ppm_trl or in an installed package."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

REPO = Path(__file__).resolve().parents[2]
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


PACKAGE = REPO / "ppm_trl"
# every module under ppm_trl by its last name (`ppm_estimators` -> ppm_trl.ppm.ppm_estimators), for the short forms
_MODULES: dict[str, set[str]] = {}
for _path in PACKAGE.rglob("*.py"):
    _parts = _path.relative_to(REPO).with_suffix("").parts
    _parts = _parts[:-1] if _parts[-1] == "__init__" else _parts
    _MODULES.setdefault(_parts[-1], set()).add(".".join(_parts))
# every class ppm_trl defines, by name (`MethodTrainer.local_rows`, `PPMConfig.overlap_scoring`)
_CLASSES: dict[str, set[str]] = {}
for _path in PACKAGE.rglob("*.py"):
    _module = ".".join(_path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
    for _name in re.findall(r"^class (\w+)", _path.read_text(), re.M):
        _CLASSES.setdefault(_name, set()).add(_module)


def _resolve(obj, attributes: list[str]):
    for attribute in attributes:
        fields = getattr(obj, "__dataclass_fields__", {})
        if hasattr(obj, attribute):
            obj = getattr(obj, attribute)
        elif attribute in fields:  # a dataclass field without a default is not a class attribute
            return True
        else:
            return None
    return True if obj is None else obj  # an attribute whose value is None (`ScoredBatch.pending`) is found


def _lookup(dotted: str):
    """The object `dotted` names in ppm_trl, or None. Its head is `ppm_trl`, a module of ppm_trl relative to the
    package (`ppm.ppm_estimators...`, `points...`) or by its own name when that is unique (`guidance_step...`), or a
    class ppm_trl defines."""
    parts = dotted.split(".")
    if parts[0] == "ppm_trl":
        parts = parts[1:]
    for end in range(len(parts), 0, -1):  # the longest module prefix, relative to ppm_trl, then attributes
        module = "ppm_trl." + ".".join(parts[:end])
        path = PACKAGE.joinpath(*parts[:end])
        if not (path.with_suffix(".py").exists() or (path / "__init__.py").exists()):
            continue
        try:
            obj = importlib.import_module(module)
        except ImportError:
            continue
        return _resolve(obj, parts[end:])
    head, rest = parts[0], parts[1:]
    for table in (_MODULES, _CLASSES):
        if len(table.get(head, ())) == 1:
            (module,) = table[head]
            obj = importlib.import_module(module)
            return _resolve(obj, rest if table is _MODULES else [head, *rest])
    return None


def _is_ppm_trl_name(dotted: str) -> bool:
    head = dotted.split(".")[0]
    return head == "ppm_trl" or head in _MODULES or head in _CLASSES or (PACKAGE / head).exists()


def _lookup_outside(dotted: str):
    """The object `dotted` names outside ppm_trl (`trl.trainer.utils.get_config_model_id`,
    `concurrent.futures.ThreadPoolExecutor`): the longest importable module prefix, then attributes; None when its
    head is no importable module (`batch.pending`: a local variable's name, not a citation a reader can follow)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        return _resolve(obj, parts[end:])
    return None


def _resolves(dotted: str) -> bool:
    found = _lookup(dotted) if _is_ppm_trl_name(dotted) else _lookup_outside(dotted)
    return found is not None


def _cited_names() -> set[str]:
    """Every dotted name in backticks (ppm_trl's or another package's; file names are the test above's), plus the
    bare names of the equation table's code column (`papo.papo_estimators.PROCESS_NORMS`, `COMBINES`: COMBINES in the module cited before it in the cell;
    `ppm/segmentation.py` (`SEGMENTATIONS`): in that file's module)."""
    cited = {
        name
        for name in re.findall(r"`([A-Za-z_]\w*(?:\.\w+)+)`", DESIGN)
        if not re.search(r"\.(?:py|md|yaml|sh|json)$", name)  # files: the test above
    }
    for line in DESIGN.splitlines():
        if not line.startswith("| ") or line.count("|") < 4:
            continue
        module = None
        for name in re.findall(r"`([\w./]+)`", line.rsplit("|", 2)[-2]):
            if name.endswith(".py"):
                module = name.removesuffix(".py").replace("/", ".")
            elif "." in name:
                module = name.rpartition(".")[0]
            elif module is not None:
                cited.add(f"{module}.{name}")
    return cited


def test_every_ppm_trl_name_the_design_cites_is_importable():
    cited = _cited_names()
    assert len(cited) >= 30, f"the patterns found only {sorted(cited)}: they no longer match the document"
    broken = sorted(name for name in cited if not _resolves(name))
    assert not broken, f"docs/design.md cites names that do not resolve (in ppm_trl or an installed package): {broken}"


def test_a_wrong_citation_is_caught():
    assert _lookup("ppm.ppm_estimators.ppm_segment_rewards") is not None
    assert _lookup("ppm.ppm_estimators.no_such_estimator") is None
    assert _lookup("guidance_step.no_such_function") is None
    assert _resolves("ScoredBatch.pending") and _resolves("trl.trainer.utils.get_config_model_id")
    assert not _resolves("batch.pending")  # an unknown head fails, it is not skipped
    assert not _resolves("trl.trainer.utils.no_such_function")
