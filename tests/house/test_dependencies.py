"""The dependency contract: pyproject.toml declares ranges, constraints/tested.txt locks each dependency at a version
inside its range (what `make install`, the demo and CI install), constraints/lower.txt pins each at its range's lower
bound (what `make test-lower` installs), and the environment running the tests is inside the ranges. Also a real
step with `report_to="wandb"` and `log_completions=True`, the only code that exercises wandb and rich (declared
dependencies the library itself never imports), so the lower-bound run covers them too."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
RUNTIME = [Requirement(line) for line in PROJECT["dependencies"]]
EXTRAS = {extra: [Requirement(line) for line in lines] for extra, lines in PROJECT["optional-dependencies"].items()}
# The test tools `make test-lower` installs beside the library (the rest of `dev`, and the vllm/deepspeed extras,
# are not run at their lower bounds: see constraints/lower.txt).
LOWER_TEST_TOOLS = {"pytest", "pytest-timeout", "hypothesis"}
# Releases of LiteLLM that were trojaned on PyPI (BerriAI/litellm#24512, #24521); no declared range may admit them.
LITELLM_BAD = ("1.82.7", "1.82.8")


def _declared() -> dict[str, Requirement]:
    """Every direct dependency, runtime and extras, by canonical name; one declaration each."""
    declared: dict[str, Requirement] = {}
    for requirement in RUNTIME + [r for group in EXTRAS.values() for r in group]:
        name = canonicalize_name(requirement.name)
        if name in declared:
            assert str(declared[name].specifier) == str(requirement.specifier), (
                f"{name} is declared twice with different ranges: {declared[name]} / {requirement}")
        declared[name] = requirement
    return declared


def _pins(path: Path) -> dict[str, Version]:
    """`name==version` lines of a constraints file (comments and blank lines allowed, nothing else)."""
    pins: dict[str, Version] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        specs = list(requirement.specifier)
        assert len(specs) == 1 and specs[0].operator == "==" and "*" not in specs[0].version, (
            f"{path.name}:{number}: {line!r} is not an exact `name==version` pin")
        name = canonicalize_name(requirement.name)
        assert name not in pins, f"{path.name}:{number}: {name} pinned twice"
        pins[name] = Version(specs[0].version)
    return pins


def _lower_bound(requirement: Requirement) -> Version:
    bounds = [Version(spec.version) for spec in requirement.specifier if spec.operator in (">=", "==", "~=")]
    assert len(bounds) == 1, f"{requirement}: a range needs exactly one lower bound (>=, ~= or ==)"
    return bounds[0]


def test_every_dependency_declares_a_range_with_a_lower_bound():
    for name, requirement in _declared().items():
        assert requirement.specifier, f"{name}: no range declared"
        _lower_bound(requirement)


def test_tested_constraints_lock_every_dependency_inside_its_range():
    declared = _declared()
    tested = _pins(ROOT / "constraints" / "tested.txt")
    assert set(tested) == set(declared), (
        f"constraints/tested.txt and pyproject.toml differ: only locked {sorted(set(tested) - set(declared))}, "
        f"only declared {sorted(set(declared) - set(tested))}")
    for name, version in tested.items():
        assert declared[name].specifier.contains(version, prereleases=True), (
            f"constraints/tested.txt locks {name}=={version}, outside the declared {declared[name]}")


def test_lower_constraints_pin_each_range_at_its_lower_bound():
    declared = _declared()
    lower = _pins(ROOT / "constraints" / "lower.txt")
    runtime = {canonicalize_name(r.name) for r in RUNTIME}
    assert set(lower) == runtime | LOWER_TEST_TOOLS, (
        f"constraints/lower.txt should pin the runtime dependencies and {sorted(LOWER_TEST_TOOLS)}: missing "
        f"{sorted(runtime | LOWER_TEST_TOOLS - set(lower))}, extra {sorted(set(lower) - runtime - LOWER_TEST_TOOLS)}")
    tested = _pins(ROOT / "constraints" / "tested.txt")
    for name, version in lower.items():
        assert version == _lower_bound(declared[name]), (
            f"constraints/lower.txt pins {name}=={version}, but the declared lower bound is {declared[name]}")
        assert declared[name].specifier.contains(version, prereleases=True), f"{name}=={version} not in its range"
        assert version <= tested[name]


def test_litellm_range_excludes_the_trojaned_releases_and_stops_at_a_vetted_one():
    litellm = _declared()["litellm"]
    for bad in LITELLM_BAD:
        assert not litellm.specifier.contains(bad, prereleases=True), f"{litellm} admits trojaned litellm {bad}"
    # A new LiteLLM release enters only after vetting (see the comment in pyproject.toml): the range is capped.
    assert any(spec.operator in ("<", "<=", "==") for spec in litellm.specifier), f"{litellm} has no upper bound"


def test_installed_dependencies_are_inside_the_declared_ranges():
    """Whatever environment runs the suite (the locks, the lower bounds, a user's stack) is one the ranges allow."""
    outside = []
    for requirement in RUNTIME:
        try:
            installed = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            outside.append(f"{requirement.name} not installed")
            continue
        if not requirement.specifier.contains(installed, prereleases=True):
            outside.append(f"{requirement.name} {installed} (declared {requirement.specifier})")
    assert not outside, "installed outside pyproject.toml's ranges: " + ", ".join(outside)


def test_makefile_installs_the_library_with_constraints():
    """Every `pip install ... -e .` of the Makefile goes through a constraints file (the locks, or the lower
    bounds), so `make install`, the demo, CI and the vLLM venv never resolve the ranges afresh."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^TESTED\s*:?=\s*constraints/tested\.txt$", makefile, re.M)
    assert re.search(r"^LOWER\s*:?=\s*constraints/lower\.txt$", makefile, re.M)
    installs = [line for line in makefile.splitlines() if re.search(r"pip install .*-e ", line)]
    assert len(installs) >= 3  # .venv, .venv-vllm, .venv-lower
    for line in installs:
        assert re.search(r"-c \$\((TESTED|LOWER)\) ", line), f"Makefile installs without constraints: {line}"


def test_a_step_reporting_to_wandb_with_completion_tables(tmp_path, capsys, monkeypatch):
    """wandb (offline: WANDB_MODE=disabled) gets TRL's metrics and completion table, rich prints the sample."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    from helpers import TINY_ARGS, script_generation

    from ppm_trl.envs import make_dataset
    from ppm_trl.ppm.ppm_config import PPMConfig
    from ppm_trl.ppm.ppm_trainer import PPMGRPOTrainer
    from ppm_trl.rewards import env_outcome_reward
    from ppm_trl.tiny import build_tiny_model_and_tokenizer

    model, tokenizer = build_tiny_model_and_tokenizer()
    args = PPMConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                     max_completion_length=16, num_segments=2, max_steps=1,
                     **{**TINY_ARGS, "report_to": ["wandb"]}, log_completions=True, num_completions_to_print=1)
    trainer = PPMGRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=env_outcome_reward, args=args,
                             train_dataset=make_dataset("multi_countdown", 1, 4, seed=0))
    script_generation(trainer, lambda prompt, index: "wandb-smoke")
    trainer.train()
    import wandb

    assert wandb.run is not None  # transformers' WandbCallback started a (disabled) run
    assert list((tmp_path / "completions").glob("completions_*.parquet"))
    assert "wandb-smoke" in capsys.readouterr().out  # rich's table of the sampled completions
    wandb.finish()


def test_the_python_floor_is_the_highest_floor_of_what_we_install():
    """Issue 43: `requires-python = ">=3.10"` while trl 1.16 and transformers 5 need 3.11: on 3.10 pip could not
    resolve the library at all. Our floor is at least every declared dependency's, ruff targets it, the README says it."""
    from packaging.specifiers import SpecifierSet

    ours = SpecifierSet(PROJECT["requires-python"])
    (floor,) = [Version(spec.version) for spec in ours if spec.operator == ">="]
    for requirement in RUNTIME:
        declared = importlib.metadata.metadata(requirement.name).get("Requires-Python")
        for spec in SpecifierSet(declared or ""):
            if spec.operator == ">=":
                assert Version(spec.version) <= floor, f"{requirement.name} needs Python {declared}; ours {ours}"
    ruff = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]["target-version"]
    assert ruff == f"py{floor.major}{floor.minor}"
    assert f"Python {floor.major}.{floor.minor}" in (ROOT / "README.md").read_text(encoding="utf-8")
