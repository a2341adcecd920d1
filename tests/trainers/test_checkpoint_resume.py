"""Checkpoints survive preemption (issue 23 item 5): a checkpoint counts only when complete, `last` resumes from the
newest complete one and says which, SIGTERM during a save or a step ends with a complete checkpoint (exit 143),
and resuming a run that reached max_steps trains no further step."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from helpers import build_trainer, script_generation
from safetensors.torch import load_file
from torch.nn.modules.module import _IncompatibleKeys

from ppm_trl.envs import make_dataset
from ppm_trl.trainers.base import CHECKPOINT_COMPLETE, checkpoint_problem, resolve_resume_checkpoint

SCRIPT = Path(__file__).resolve().parents[1] / "preempted_train_script.py"


def _trainer(output_dir, max_steps, **overrides):
    settings = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=16, num_segments=2,
                    max_steps=max_steps, save_strategy="steps", save_steps=1)
    trainer = build_trainer("ppm", output_dir, train_dataset=make_dataset("multi_add", 2, 8, seed=0),
                            **{**settings, **overrides})
    return trainer, script_generation(trainer, lambda prompt, index: "1")


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
    """A finished 2-step run with checkpoint-1 and checkpoint-2 (copied by each test that changes it)."""
    output = tmp_path_factory.mktemp("run") / "out"
    trainer, _ = _trainer(output, max_steps=2)
    trainer.train()
    return output


def _copy(run, tmp_path) -> Path:
    target = tmp_path / "out"
    shutil.copytree(run, target)
    return target


def _interrupted_copy(source: Path, target: Path, keep_marker: bool = False) -> None:
    """What a save killed mid-way leaves: optimizer.pt truncated, no trainer_state.json."""
    shutil.copytree(source, target)
    optimizer = target / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:100])
    (target / "trainer_state.json").unlink()
    if not keep_marker:
        (target / CHECKPOINT_COMPLETE).unlink()


def test_every_saved_checkpoint_is_marked_complete(two_steps):
    for step in (1, 2):
        folder = two_steps / f"checkpoint-{step}"
        files = json.loads((folder / CHECKPOINT_COMPLETE).read_text())["files"]
        assert {"optimizer.pt", "trainer_state.json", "model.safetensors"} <= set(files)
        assert checkpoint_problem(str(folder)) is None


def test_incomplete_checkpoints_are_recognised(two_steps, tmp_path):
    cases = {"no marker, no state": dict(keep_marker=False), "marker, truncated file": dict(keep_marker=True)}
    for index, (name, kwargs) in enumerate(cases.items()):
        target = tmp_path / f"c{index}"
        _interrupted_copy(two_steps / "checkpoint-2", target, **kwargs)
        assert checkpoint_problem(str(target)) is not None, name
    legacy = tmp_path / "legacy"  # written before the marker existed: trainer_state.json (the last file) suffices
    shutil.copytree(two_steps / "checkpoint-2", legacy)
    (legacy / CHECKPOINT_COMPLETE).unlink()
    assert checkpoint_problem(str(legacy)) is None
    (legacy / "trainer_state.json").write_text('{"global_step": ')  # cut while written
    assert "unreadable" in checkpoint_problem(str(legacy))


@pytest.mark.parametrize("value", [True, "true", "last", "LAST"])
def test_last_takes_the_newest_complete_checkpoint_and_says_which(two_steps, tmp_path, value):
    run = _copy(two_steps, tmp_path)
    _interrupted_copy(run / "checkpoint-2", run / "checkpoint-3")
    _interrupted_copy(run / "checkpoint-2", run / "checkpoint-10", keep_marker=True)  # 10 > 3 > 2 numerically
    path, message = resolve_resume_checkpoint(value, str(run))
    assert path == str(run / "checkpoint-2")
    assert message.startswith("resuming from checkpoint-2 (newest complete; skipped checkpoint-10: incomplete, "
                              "optimizer.pt has 100 bytes")
    assert "checkpoint-3: incomplete, no trainer_state.json" in message
    assert resolve_resume_checkpoint(value, str(two_steps)) == (str(two_steps / "checkpoint-2"),
                                                                "resuming from checkpoint-2 (the newest)")


def test_unusable_resume_values_are_one_line_errors(two_steps, tmp_path):
    run = _copy(two_steps, tmp_path)
    _interrupted_copy(run / "checkpoint-2", run / "checkpoint-3")
    with pytest.raises(ValueError, match=r"checkpoint-3' is incomplete: no trainer_state.json .*pass `last`"):
        resolve_resume_checkpoint(str(run / "checkpoint-3"), str(run))
    with pytest.raises(ValueError, match="no such checkpoint folder"):
        resolve_resume_checkpoint(str(run / "checkpoint-7"), str(run))
    empty = tmp_path / "empty"
    _interrupted_copy(run / "checkpoint-2", empty / "checkpoint-5")
    with pytest.raises(ValueError, match=r"no complete checkpoint in output_dir .*checkpoint-5: incomplete"):
        resolve_resume_checkpoint("last", str(empty))
    with pytest.raises(ValueError, match="no complete checkpoint"):
        resolve_resume_checkpoint("last", str(tmp_path / "never-created"))
    for value in (None, False, "false", "None", ""):
        assert resolve_resume_checkpoint(value, str(run)) == (None, None)


def test_train_resumes_past_a_partial_checkpoint_and_rewrites_it(two_steps, tmp_path, capsys):
    run = _copy(two_steps, tmp_path)
    _interrupted_copy(run / "checkpoint-2", run / "checkpoint-3")
    trainer, generations = _trainer(run, max_steps=3)
    trainer.train(resume_from_checkpoint=True)  # transformers alone picks checkpoint-3 and dies on it
    assert "resuming from checkpoint-2 (newest complete; skipped checkpoint-3" in capsys.readouterr().err
    assert trainer.state.global_step == 3 and len(generations) == 1
    assert checkpoint_problem(str(run / "checkpoint-3")) is None  # saved again, whole


def test_resuming_a_finished_run_trains_no_extra_step(two_steps, tmp_path, capsys):
    run = _copy(two_steps, tmp_path)
    trainer, generations = _trainer(run, max_steps=2)
    result = trainer.train(resume_from_checkpoint="last")
    assert "checkpoint-2 already reached max_steps (2 steps): nothing to train" in capsys.readouterr().err
    assert (result.global_step, len(generations), trainer.state.global_step) == (2, 0, 2)
    assert not (run / "checkpoint-3").exists()
    saved = load_file(str(run / "checkpoint-2" / "model.safetensors"))  # the model is the checkpoint's
    for name, value in trainer.model.state_dict().items():
        if name in saved:
            assert torch.equal(value, saved[name]), name
    longer, generations = _trainer(run, max_steps=3)  # raising max_steps continues: exactly one more step
    assert longer.train(resume_from_checkpoint="last").global_step == 3 and len(generations) == 1


def test_resume_errors_in_the_cli_come_before_the_model(two_steps, tmp_path, capsys):
    from ppm_trl import cli

    run = tmp_path / "out"
    _interrupted_copy(two_steps / "checkpoint-2", run / "checkpoint-2")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--env_name", "multi_add", "--model_name_or_path", "./no/such/model", "--output_dir",
                  str(run), "--use_cpu", "true", "--per_device_train_batch_size", "4", "--num_generations", "4",
                  "--resume_from_checkpoint", "last"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err and err.count("error:") == 1
    assert "no complete checkpoint in output_dir" in err and "checkpoint-2: incomplete, no trainer_state.json" in err


def _run_script(output, when, max_steps, resume=None):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SCRIPT.parents[1]), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-W", "ignore", str(SCRIPT), str(output), when, str(max_steps)]
    return subprocess.run(command + ([resume] if resume else []), env=env, capture_output=True, text=True, timeout=600)


def test_ctrl_c_finishes_the_step_saves_and_exits_130(tmp_path):
    """Issue 33 item 4: Ctrl-C (SIGINT) behaves like SIGTERM — the step finishes, its checkpoint is saved (saving
    off), one line instead of a KeyboardInterrupt traceback, exit 130 — and `last` resumes it."""
    output = tmp_path / "out"
    interrupted = _run_script(output, "ctrl_c", max_steps=4)
    assert interrupted.returncode == 130, interrupted.stderr[-3000:]
    assert "Traceback" not in interrupted.stderr and "KeyboardInterrupt" not in interrupted.stderr
    assert "ppm_trl: Ctrl-C: finishing this step" in interrupted.stderr
    assert interrupted.stderr.strip().splitlines()[-1].startswith("ppm_trl: stopped by Ctrl-C after step 2; its "
                                                                  "checkpoint is saved in ")
    assert sorted(p.name for p in output.glob("checkpoint-*")) == ["checkpoint-2"]
    assert checkpoint_problem(str(output / "checkpoint-2")) is None
    resumed = _run_script(output, "none", max_steps=4, resume="last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "steps trained: 2" in resumed.stdout


@pytest.mark.parametrize("when", ["during_save", "during_step"])
def test_sigterm_ends_with_a_complete_checkpoint_and_last_resumes_it(tmp_path, when):
    output = tmp_path / "out"
    preempted = _run_script(output, when, max_steps=4)
    assert preempted.returncode == 128 + signal.SIGTERM, preempted.stderr[-3000:]
    assert "stopped by SIGTERM after step 2" in preempted.stderr
    assert sorted(p.name for p in output.glob("checkpoint-*")) == (
        ["checkpoint-1", "checkpoint-2"] if when == "during_save" else ["checkpoint-2"])
    assert checkpoint_problem(str(output / "checkpoint-2")) is None
    assert json.loads((output / "checkpoint-2" / "trainer_state.json").read_text())["global_step"] == 2
    resumed = _run_script(output, "none", max_steps=4, resume="last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from checkpoint-2 (the newest)" in resumed.stderr
    assert "steps trained: 2" in resumed.stdout  # steps 3 and 4


def test_a_resumed_run_is_judged_on_the_steps_it_trained(two_steps, tmp_path, capsys):
    """Issue 44: "nothing was learned" printed on resume — judged on the whole history, not this invocation's
    steps. Resumed at max_steps it trained none and says nothing; resumed one step further it is judged on that."""
    from ppm_trl.report import nothing_learned_this_run

    run = _copy(two_steps, tmp_path)
    finished, _ = _trainer(run, max_steps=2)
    finished.train(resume_from_checkpoint="last")
    assert finished.first_step_of_this_run == 2 and nothing_learned_this_run(finished) is None
    assert "zero advantage" in (nothing_learned_this_run(_whole_history(finished)) or "")  # the old rule warned
    longer, _ = _trainer(run, max_steps=3)
    longer.train(resume_from_checkpoint="last")
    assert longer.first_step_of_this_run == 2  # step 3 alone is judged: it filtered every group, so it warns
    assert "every group had zero advantage" in nothing_learned_this_run(longer)


def _whole_history(trainer):
    from types import SimpleNamespace

    return SimpleNamespace(state=trainer.state, args=trainer.args, first_step_of_this_run=0)


def _half_right(prompt: str, index: int) -> str:
    """Every other completion works the sums out right, the rest answers wrong: groups with a non-zero advantage."""
    sums = [(name, x, y, int(x) + int(y)) for name, x, y in re.findall(r"(\w):(\d+)\+(\d+)", prompt)]
    lines = "".join(f"{name}:{x}+{y}={total}\n" for name, x, y, total in sums)
    answer = ",".join(f"{name}={total}" for name, _, _, total in sums)
    return f"{lines}\\boxed{{{answer}}}" if index % 2 == 0 else "\\boxed{a=1}"


def test_a_resumed_run_ends_with_the_uninterrupted_weights_and_says_nothing_of_missing_keys(tmp_path, monkeypatch):
    """Issue 44: every resume printed `There were missing keys in the checkpoint model loaded: ['lm_head.weight']`.
    The tiny model's head is tied to its embeddings, which transformers 5 saves once; it was loaded with them. Checked
    here, not assumed: resumed from checkpoint-1, step 2 ends on the weights of a run never interrupted (steps that
    changed the weights), the head still the embeddings' tensor, and no missing-key warning."""
    warned = []
    monkeypatch.setattr(transformers.trainer.logger, "warning", lambda message, *a, **k: warned.append(str(message)))
    whole, _ = _trainer(tmp_path / "whole", max_steps=2)
    script_generation(whole, _half_right)
    whole.train()
    resumed, _ = _trainer(tmp_path / "resumed", max_steps=2)
    script_generation(resumed, _half_right)
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-1"))
    first = load_file(str(tmp_path / "whole" / "checkpoint-1" / "model.safetensors"))
    final = load_file(str(tmp_path / "whole" / "checkpoint-2" / "model.safetensors"))
    assert "lm_head.weight" not in final  # saved once, as the embeddings
    assert any(not torch.equal(first[name], final[name]) for name in final)  # step 2 trained something
    state = resumed.model.state_dict()
    assert all(torch.equal(state[name], final[name]) for name in final)
    assert resumed.model.lm_head.weight is resumed.model.get_input_embeddings().weight
    assert not [message for message in warned if "missing keys" in message]


def test_a_weight_really_missing_from_a_checkpoint_is_still_reported(two_steps, tmp_path, monkeypatch):
    """Only a name whose tensor was loaded under another name is left out of transformers' warning."""
    warned = []
    monkeypatch.setattr(transformers.trainer.logger, "warning", lambda message, *a, **k: warned.append(str(message)))
    trainer, _ = _trainer(tmp_path / "out", max_steps=1)
    trainer._issue_warnings_after_load(_IncompatibleKeys(["lm_head.weight", "model.norm.weight"], []))
    assert warned == ["There were missing keys in the checkpoint model loaded: ['model.norm.weight']."]
    trainer.model.lm_head.weight = torch.nn.Parameter(trainer.model.lm_head.weight.detach().clone())  # untied
    trainer._issue_warnings_after_load(_IncompatibleKeys(["lm_head.weight"], []))
    assert warned[-1] == "There were missing keys in the checkpoint model loaded: ['lm_head.weight']."
