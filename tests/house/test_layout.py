"""The layout a newcomer changes in one place: one folder per method, the seam a small package, named hand-offs, one
table per variant concept, one address per name, no import hook, no file too long to read in one sitting."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pathlib
import subprocess
import sys
from collections import Counter

import pytest

import ppm_trl

PACKAGE = pathlib.Path(ppm_trl.__file__).parent
MAX_LINES = 500


def _modules():
    return sorted(path for path in PACKAGE.rglob("*.py") if "__pycache__" not in path.parts)


# ---------------------------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------------------------


def test_no_file_under_ppm_trl_is_longer_than_the_limit():
    long = {str(path.relative_to(PACKAGE)): n for path in _modules()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}"


def test_a_test_file_imports_test_modules_of_its_own_folder_only():
    """pytest puts a test file's folder on `sys.path` when it collects it: a `from test_x import ...` of another
    folder's file works only when that folder happened to be collected first (shared code lives in tests/helpers.py)."""
    tests = pathlib.Path(__file__).resolve().parents[1]
    strays = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("test_"):
                if not (path.parent / f"{node.module}.py").exists():
                    strays.append(f"{path.relative_to(tests)}:{node.lineno} imports {node.module}")
    assert strays == []


def test_no_two_modules_share_a_file_name():
    """One file name, one module (a package's `__init__.py` and `__main__.py` aside)."""
    names = Counter(path.name for path in _modules() if path.name not in ("__init__.py", "__main__.py"))
    assert [name for name, count in names.items() if count > 1] == []


@pytest.mark.parametrize("method", ["ppm", "papo", "arg"])
def test_each_method_is_one_folder_with_its_config_trainer_and_registration(method):
    folder = PACKAGE / method
    assert (folder / f"{method}_config.py").is_file() and (folder / f"{method}_trainer.py").is_file()
    source = (folder / "__init__.py").read_text(encoding="utf-8")
    assert "register_method(" in source  # its registration lives in its own folder


def test_the_seam_is_a_package_of_small_parts():
    from ppm_trl.trainers import base

    seam = pathlib.Path(base.__file__).parent
    parts = {path.stem for path in seam.glob("*.py")}
    assert {"contract", "hooks", "generation", "checkpoints", "preemption", "model_card", "hub",
            "method_trainer"} <= parts
    assert not (seam.parent / "base.py").exists()


# ---------------------------------------------------------------------------------------------------------------
# ppm_trl.arg: a real package, no import hook, and `import ppm_trl` stays light
# ---------------------------------------------------------------------------------------------------------------


def test_ppm_trl_arg_is_a_real_package_and_imports_stay_light():
    """DESIGN.md's Public API imports ARG's pure core from `ppm_trl.arg`: the ARG folder itself (no `sys.meta_path`
    alias); in a fresh interpreter, `import ppm_trl` imports no torch and the pure core no TRL."""
    root = str(PACKAGE.parent)
    script = (
        "import sys, ppm_trl\n"
        "assert 'torch' not in sys.modules, 'import ppm_trl imported torch'\n"
        "assert not [f for f in sys.meta_path if type(f).__module__.startswith('ppm_trl')], 'an import hook'\n"
        "from ppm_trl.arg import PrefixSelector, accept_candidates, surprisal_prefix_length\n"
        "import ppm_trl.arg\n"
        "assert ppm_trl.arg.__file__.endswith('arg/__init__.py') and ppm_trl.arg.__spec__.name == 'ppm_trl.arg'\n"
        "assert PrefixSelector is ppm_trl.PrefixSelector\n"
        "assert PrefixSelector.__module__ == 'ppm_trl.arg.selector'\n"
        "assert surprisal_prefix_length([-1.0, -1.0], 0.5) == 1 and accept_candidates([]) == []\n"
        "assert not any(m == 'trl' or m.startswith(('trl.', 'transformers')) for m in sys.modules), 'TRL imported'\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                            cwd=root, env={"PYTHONPATH": root, "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


PURE_MODULES = ["ppm_trl.advantages", "ppm_trl.points", "ppm_trl.text", "ppm_trl.scorers", "ppm_trl.registry",
                "ppm_trl.methods", "ppm_trl.ppm.ppm_estimators", "ppm_trl.ppm.segmentation",
                "ppm_trl.ppm.progress_scorers", "ppm_trl.papo.papo_estimators", "ppm_trl.papo.process_scorers",
                "ppm_trl.arg.surprisal", "ppm_trl.arg.prefixes", "ppm_trl.arg.selector", "ppm_trl.arg.acceptance",
                "ppm_trl.arg.references", "ppm_trl.arg.guidance_step"]


def test_the_pure_maths_imports_no_trl():
    """Every equation module, the method folders' pure pieces included, imports neither TRL nor transformers."""
    root = str(PACKAGE.parent)
    script = (f"import importlib, sys\nfor name in {PURE_MODULES!r}:\n    importlib.import_module(name)\n"
              "print(sorted(m for m in sys.modules if m == 'trl' or m.startswith(('trl.', 'transformers'))))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            cwd=root, env={"PYTHONPATH": root, "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout[-2000:] + result.stderr[-2000:]


# ---------------------------------------------------------------------------------------------------------------
# One address per name: the scaffolding of the move to one folder per method is gone
# ---------------------------------------------------------------------------------------------------------------

# (the check is a grep for the old paths: they are spelled here only in parts)
GONE_MODULES = [*(f"ppm_trl.trainers.{method}" for method in ("ppm", "papo", "arg", "composed")), "ppm_trl.guidance",
                "ppm_trl.segments"]


@pytest.mark.parametrize("module", GONE_MODULES)
def test_an_old_module_path_is_gone(module):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(module)


@pytest.mark.parametrize("old, name", [("ppm_trl.configs", "PPMConfig"), ("ppm_trl.advantages", "papo_advantages"),
                                       ("ppm_trl.scorers", "ProgressScorer")])
def test_a_shared_module_no_longer_hands_out_a_method_name(old, name):
    """`configs`, `advantages` and `scorers` sit below the method folders: they neither import nor name them."""
    module = importlib.import_module(old)
    assert not hasattr(module, "__getattr__") and not hasattr(module, name)


REPOSITORY = PACKAGE.parent
IMPORTING_TREES = ["ppm_trl", "tests", "benchmarks", "examples", "scripts"]


def _reexported_imports():
    """Every `from ppm_trl.X import name` in the repository whose `X` is a module (not a package: a package's
    `__init__` is a public address) that does not define `name` itself."""
    found = []
    for tree in IMPORTING_TREES:
        for path in sorted((REPOSITORY / tree).rglob("*.py")):
            if "trl_upstream" in path.parts and path.name != "harness.py":
                continue
            relative = path.relative_to(REPOSITORY)
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.ImportFrom):
                    continue
                module = node.module or ""
                if node.level:
                    here = list(relative.with_suffix("").parts)
                    here = here[:-1] if here[-1] != "__init__" else here[:-1]
                    base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                    module = ".".join([*base, *([module] if module else [])])
                if not module.startswith("ppm_trl."):
                    continue
                file = REPOSITORY.joinpath(*module.split("."))
                if file.is_dir() or not file.with_suffix(".py").is_file():
                    continue
                tree_of_module = ast.parse(file.with_suffix(".py").read_text(encoding="utf-8"))
                defined = {target.id for node_ in tree_of_module.body if isinstance(node_, ast.Assign)
                           for target in node_.targets if isinstance(target, ast.Name)}
                defined |= {node_.target.id for node_ in tree_of_module.body if isinstance(node_, ast.AnnAssign)
                            and isinstance(node_.target, ast.Name)}
                defined |= {node_.name for node_ in tree_of_module.body
                            if isinstance(node_, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
                found += [f"{relative}:{node.lineno} {module}.{alias.name}" for alias in node.names
                          if alias.name not in defined and not file.joinpath(alias.name).exists()
                          and not file.with_name(alias.name + ".py").exists()]
    return found


def test_every_import_names_the_module_that_defines_the_name():
    """No re-exports between modules: tests, benchmarks and examples exercise the layout the docs describe."""
    assert _reexported_imports() == []


# ---------------------------------------------------------------------------------------------------------------
# Named hand-offs
# ---------------------------------------------------------------------------------------------------------------

HAND_OFFS = [
    ("ppm_trl.ppm.ppm_trainer", "PendingProgress"),
    ("ppm_trl.papo.papo_trainer", "PendingProcessScores"),
    ("ppm_trl.arg.arg_trainer", "ReferenceTokens"),
    ("ppm_trl.arg.arg_trainer", "PlannedContinuation"),
    ("ppm_trl.arg.arg_trainer", "Trajectory"),
    ("ppm_trl.arg.arg_trainer", "GeneratedCandidate"),
    ("ppm_trl.arg.arg_trainer", "Replacement"),
    ("ppm_trl.trainers.base.hooks", "ScoredBatch"),
    ("ppm_trl.trainers.base.hooks", "EarlyRewards"),
    ("ppm_trl.trainers.base.hooks", "RewardedRows"),
]


@pytest.mark.parametrize("module, name", HAND_OFFS, ids=[name for _, name in HAND_OFFS])
def test_what_passes_between_hooks_is_a_named_frozen_dataclass(module, name):
    cls = getattr(importlib.import_module(module), name)
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, name
    assert cls.__doc__ and not cls.__doc__.startswith(f"{name}("), f"{name} needs a docstring"
    instance = cls(*[None] * len(dataclasses.fields(cls)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(instance, dataclasses.fields(cls)[0].name, None)


def test_arg_leaves_the_callers_config_alone(tmp_path):
    """ARG weighs `format` by `format_reward_weight` (the paper's accuracy + 0.2·format) on its own copy of the
    config: the caller's `reward_weights` stays None, so the same config can build a trainer with other rewards."""
    from datasets import Dataset
    from helpers import TINY_ARGS

    from ppm_trl.arg import ARGConfig, ARGTrainer
    from ppm_trl.rewards import accuracy_reward, format_reward
    from ppm_trl.tiny import build_tiny_model_and_tokenizer

    args = ARGConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                     max_completion_length=32, arg_max_accepted=2, arg_min_continuation_tokens=8, **TINY_ARGS)
    data = Dataset.from_dict({"prompt": ["What is 3+4?"] * 4, "answer": ["7"] * 4,
                              "reference": ["So 3+4=7.\n\\boxed{7}"] * 4})
    model, tokenizer = build_tiny_model_and_tokenizer()
    trainer = ARGTrainer(model=model, processing_class=tokenizer, reward_funcs=[accuracy_reward, format_reward],
                         args=args, train_dataset=data)
    assert trainer.outcome_reward_weights.tolist() == pytest.approx([1.0, 0.2])
    assert args.reward_weights is None and trainer.args.reward_weights == pytest.approx([1.0, 0.2])


# ---------------------------------------------------------------------------------------------------------------
# One table per variant concept, the config's accepted values its keys
# ---------------------------------------------------------------------------------------------------------------


def test_a_new_segmentation_is_one_table_entry(tmp_path, monkeypatch):
    """`PPMConfig.segmentation` accepts exactly `SEGMENTATIONS`' keys, and the trainer cuts through the entry alone."""
    import torch

    from ppm_trl.ppm import segmentation
    from ppm_trl.ppm.ppm_config import PPMConfig

    common = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", num_generations=2,
                  per_device_train_batch_size=2)
    with pytest.raises(ValueError, match="segmentation='halves' is not supported; accepted values: equal_chunks, "
                                         "turns, delimiter"):
        PPMConfig(segmentation="halves", **common)
    halves = segmentation.Segmentation(
        prefix_lengths=lambda ids, tools, decode, settings: torch.tensor([[len(i) // 2, len(i)] for i in ids]),
        segment_ids=lambda mask, tools, prefix, settings: segmentation.prefix_segment_ids(prefix, mask))
    monkeypatch.setitem(segmentation.SEGMENTATIONS, "halves", halves)
    args = PPMConfig(segmentation="halves", num_segments=2, **common)
    assert args.segmentation == "halves"


def test_a_new_estimator_pair_is_one_table_entry(tmp_path, monkeypatch):
    from ppm_trl.ppm import ppm_estimators
    from ppm_trl.ppm.ppm_config import PPMConfig

    common = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", num_generations=2,
                  per_device_train_batch_size=2)
    assert ppm_estimators.accepted_granularities() == ("segment", "trajectory")
    assert ppm_estimators.accepted_progress_modes() == ("ppm", "exact_order", "process_reward")
    with pytest.raises(ValueError, match="is not an estimator: the process-reward baseline"):
        PPMConfig(granularity="trajectory", progress_mode="process_reward", **common)
    with pytest.raises(ValueError, match="granularity='token' is not supported"):
        PPMConfig(granularity="token", **common)
    monkeypatch.setitem(ppm_estimators.PPM_ESTIMATORS, ("token", "ppm"), ppm_estimators.ppm_segment_advantages)
    assert PPMConfig(granularity="token", **common).granularity == "token"
    assert ppm_estimators.ppm_estimator("token", "ppm") is ppm_estimators.ppm_segment_advantages


def test_both_scorer_tables_offer_the_same_scorers_and_the_configs_read_them():
    from ppm_trl.configs import SCORERS
    from ppm_trl.papo.process_scorers import PROCESS_SCORERS
    from ppm_trl.ppm.progress_scorers import PROGRESS_SCORERS

    assert tuple(PROGRESS_SCORERS) == tuple(PROCESS_SCORERS) == SCORERS


def test_papo_ablations_are_tables_and_the_config_reads_their_keys(tmp_path):
    from ppm_trl.papo.papo_config import PAPOConfig
    from ppm_trl.papo.papo_estimators import COMBINES, PROCESS_NORMS

    assert tuple(PROCESS_NORMS) == ("correct_subset", "full") and tuple(COMBINES) == ("decoupled", "multiplicative")
    common = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", num_generations=2,
                  per_device_train_batch_size=2)
    for norm in PROCESS_NORMS:
        for combine in COMBINES:
            assert PAPOConfig(process_norm=norm, combine=combine, **common).combine == combine
    with pytest.raises(ValueError, match="accepted values: correct_subset, full"):
        PAPOConfig(process_norm="half", **common)
