"""A method from another package (issue 43 item 5): a distribution that declares an entry point in the group
`ppm_trl.methods` is found by `ppm-trl train --method` and named in the model card, without a line in ppm_trl.

The package is a real distribution on the import path — a module and its `.dist-info` with `entry_points.txt`, what
`pip install` writes — made in a temporary directory and put on `PYTHONPATH` of a child process, so the test leaves
the environment as it found it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

THEIR_MODULE = textwrap.dedent('''
    """A team's own method: GRPO whose advantages are halved (enough to tell it ran)."""
    from ppm_trl.registry import Method, register_method
    from ppm_trl.ppm.ppm_trainer import PPMGRPOTrainer


    class HalfTrainer(PPMGRPOTrainer):
        """PPM, advantages halved."""


    register_method(Method("half_ppm", "ppm_trl.ppm.ppm_config:PPMConfig", "their_methods:HalfTrainer",
                           summary="PPM with halved advantages (an external method)", card_name="Half-PPM"))
''')


def _package(root) -> str:
    root.mkdir()
    (root / "their_methods.py").write_text(THEIR_MODULE)
    info = root / "their_methods-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: their-methods\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[ppm_trl.methods]\nhalf_ppm = their_methods\n")
    return str(root)


def test_an_installed_package_adds_a_method_that_trains_from_the_cli(tmp_path):
    path = _package(tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [path, os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    listed = subprocess.run([sys.executable, "-c", "from ppm_trl.registry import METHODS; print(sorted(METHODS))"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert "'half_ppm'" in listed.stdout, listed.stderr[-2000:]
    out = tmp_path / "out"
    trained = subprocess.run(
        [sys.executable, "-m", "ppm_trl.cli", "train", "--method", "half_ppm", "--model_name_or_path", "tiny",
         "--env_name", "multi_countdown", "--env_n", "1", "--env_size", "8", "--output_dir", str(out),
         "--use_cpu", "true", "--bf16", "false", "--gradient_checkpointing", "false",
         "--per_device_train_batch_size", "4", "--num_generations", "4", "--max_completion_length", "16",
         "--num_segments", "2", "--progress_scorer", "programmatic", "--max_steps", "1", "--save_strategy", "no",
         "--report_to", "none"], env=env, capture_output=True, text=True, timeout=900)
    assert trained.returncode == 0, trained.stderr[-3000:]
    done = next(line for line in trained.stdout.splitlines() if line.startswith("ppm-trl train: done"))
    assert json.loads(done.split("done ", 1)[1])["method"] == "half_ppm"
    assert "Half-PPM" in (out / "README.md").read_text()  # the card names the external method


def test_a_package_whose_method_does_not_load_is_a_warning_not_a_broken_ppm_trl(tmp_path):
    root = tmp_path / "site"
    root.mkdir()
    info = root / "broken-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[ppm_trl.methods]\nbroken = no_such_module_anywhere\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    listed = subprocess.run([sys.executable, "-c", "from ppm_trl.registry import METHODS; print(sorted(METHODS))"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0 and "'ppm'" in listed.stdout
    assert "the method entry point 'broken' (no_such_module_anywhere) did not load: ModuleNotFoundError" in listed.stderr
