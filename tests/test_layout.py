"""The layout a newcomer changes in one place: one folder per method, the seam a small package, named hand-offs, one
table per variant concept, old import paths kept, no import hook, no file too long to read in one sitting."""

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


def test_no_two_modules_with_code_share_a_file_name():
    """One file name, one module: only the old-path modules that re-export (no function or class of their own, e.g.
    `trainers/composed.py` for `composed.py`) may repeat a name."""
    def defines_code(path):
        return any(isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name != "__getattr__"
                   for node in ast.parse(path.read_text(encoding="utf-8")).body)

    names = Counter(path.name for path in _modules() if path.name != "__init__.py" and defines_code(path))
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
    alias), whose names `ppm_trl.guidance` keeps as the same objects; in a fresh interpreter, `import ppm_trl` imports
    no torch and the pure core no TRL."""
    root = str(PACKAGE.parent)
    script = (
        "import sys, ppm_trl\n"
        "assert 'torch' not in sys.modules, 'import ppm_trl imported torch'\n"
        "assert not [f for f in sys.meta_path if type(f).__module__.startswith('ppm_trl')], 'an import hook'\n"
        "from ppm_trl.arg import PrefixSelector, accept_candidates, surprisal_prefix_length\n"
        "import ppm_trl.arg, ppm_trl.guidance\n"
        "assert ppm_trl.arg.__file__.endswith('arg/__init__.py') and ppm_trl.arg.__spec__.name == 'ppm_trl.arg'\n"
        "assert ppm_trl.arg is not ppm_trl.guidance\n"
        "assert PrefixSelector is ppm_trl.PrefixSelector is ppm_trl.guidance.PrefixSelector\n"
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
                "ppm_trl.arg.references", "ppm_trl.arg.guidance_step", "ppm_trl.guidance", "ppm_trl.segments"]


def test_the_pure_maths_imports_no_trl():
    """Every equation module, the method folders' pure pieces included, imports neither TRL nor transformers."""
    root = str(PACKAGE.parent)
    script = (f"import importlib, sys\nfor name in {PURE_MODULES!r}:\n    importlib.import_module(name)\n"
              "print(sorted(m for m in sys.modules if m == 'trl' or m.startswith(('trl.', 'transformers'))))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            cwd=root, env={"PYTHONPATH": root, "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout[-2000:] + result.stderr[-2000:]


def test_the_guidance_module_keeps_every_name_of_the_arg_core():
    import ppm_trl.arg as arg
    import ppm_trl.guidance as guidance

    pure = [name for name, module in arg._EXPORTS.items() if module not in ("arg_config", "arg_trainer")]
    assert pure and all(getattr(guidance, name) is getattr(arg, name) for name in pure)


# ---------------------------------------------------------------------------------------------------------------
# Old import paths name the very same objects
# ---------------------------------------------------------------------------------------------------------------

OLD_PATHS = [  # (old module, name, new module)
    ("ppm_trl.configs", "PPMConfig", "ppm_trl.ppm.ppm_config"),
    ("ppm_trl.configs", "PAPOConfig", "ppm_trl.papo.papo_config"),
    ("ppm_trl.configs", "ARGConfig", "ppm_trl.arg.arg_config"),
    ("ppm_trl.configs", "PPMARGConfig", "ppm_trl.composed"),
    ("ppm_trl.configs", "PAPOARGConfig", "ppm_trl.composed"),
    ("ppm_trl.configs", "ARG_MODES", "ppm_trl.arg.arg_config"),
    ("ppm_trl.trainers.ppm", "PPMGRPOTrainer", "ppm_trl.ppm.ppm_trainer"),
    ("ppm_trl.trainers.papo", "PAPOTrainer", "ppm_trl.papo.papo_trainer"),
    ("ppm_trl.trainers.arg", "ARGTrainer", "ppm_trl.arg.arg_trainer"),
    ("ppm_trl.trainers.arg", "SELECTOR_STATE_FILE", "ppm_trl.arg.arg_trainer"),
    ("ppm_trl.trainers.composed", "PPMARGTrainer", "ppm_trl.composed"),
    ("ppm_trl.trainers.composed", "PAPOARGTrainer", "ppm_trl.composed"),
    ("ppm_trl.advantages", "ppm_segment_advantages", "ppm_trl.ppm.ppm_estimators"),
    ("ppm_trl.advantages", "ppm_estimator", "ppm_trl.ppm.ppm_estimators"),
    ("ppm_trl.advantages", "exact_order_progress", "ppm_trl.ppm.ppm_estimators"),
    ("ppm_trl.advantages", "papo_advantages", "ppm_trl.papo.papo_estimators"),
    ("ppm_trl.advantages", "PAPOStats", "ppm_trl.papo.papo_estimators"),
    ("ppm_trl.segments", "delimiter_prefix_lengths", "ppm_trl.ppm.segmentation"),
    ("ppm_trl.segments", "expand_segment_values", "ppm_trl.advantages"),
    ("ppm_trl.scorers", "ProgressScorer", "ppm_trl.ppm.progress_scorers"),
    ("ppm_trl.scorers", "build_progress_scorer", "ppm_trl.ppm.progress_scorers"),
    ("ppm_trl.scorers", "ProgrammaticProcessScorer", "ppm_trl.papo.process_scorers"),
    ("ppm_trl.scorers", "build_process_scorer", "ppm_trl.papo.process_scorers"),
    ("ppm_trl.guidance", "PrefixSelector", "ppm_trl.arg.selector"),
    ("ppm_trl.guidance", "scan_failures", "ppm_trl.arg.guidance_step"),
    ("ppm_trl.trainers.base", "MethodTrainer", "ppm_trl.trainers.base.method_trainer"),
    ("ppm_trl.trainers.base", "Advantages", "ppm_trl.trainers.base.hooks"),
    ("ppm_trl.trainers.base", "resolve_resume_checkpoint", "ppm_trl.trainers.base.checkpoints"),
]


@pytest.mark.parametrize("old, name, new", OLD_PATHS, ids=[f"{old}.{name}" for old, name, _ in OLD_PATHS])
def test_an_old_import_path_names_the_same_object(old, name, new):
    value = getattr(importlib.import_module(old), name)
    assert value is getattr(importlib.import_module(new), name)
    exec(f"from {old} import {name} as imported", namespace := {})
    assert namespace["imported"] is value


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
