"""Crafted checkpoint files (issue 34 item 3): a checkpoint whose RNG state, optimizer, ARG selector state or
trainer_state.json was edited or planted, or that is a symbolic link, is one `CheckpointError` line naming the file
when resumed — not a traceback from inside transformers or torch — and torch files still load `weights_only`
(a pickle that would run code is refused, not run). Each crafted checkpoint gets a fresh completion marker, as an
attacker who can write the folder would write one."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from test_checkpoint_resume import _trainer

from ppm_trl.trainers.base import CheckpointError, resolve_resume_checkpoint, write_completion_marker

RAN = []  # what a planted pickle would have appended to, had it been unpickled without weights_only


class RunsCodeWhenUnpickled:
    def __reduce__(self):
        return (RAN.append, ("code ran",))


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
    """A finished 2-step PPM run with checkpoint-1 and checkpoint-2 (copied by each test)."""
    output = tmp_path_factory.mktemp("run") / "out"
    trainer, _ = _trainer(output, max_steps=2)
    trainer.train()
    return output


def _crafted(run: Path, tmp_path: Path, name: str, content) -> Path:
    """A copy of the run whose checkpoint-1 has `name` replaced by `content` (bytes, or an object torch saves)."""
    target = tmp_path / "out"
    shutil.copytree(run, target)
    shutil.rmtree(target / "checkpoint-2")
    folder = target / "checkpoint-1"
    if isinstance(content, bytes):
        (folder / name).write_bytes(content)
    else:
        torch.save(content, folder / name)
    write_completion_marker(str(folder))
    return folder


def _assert_one_line(error: pytest.ExceptionInfo, path: Path, *fragments: str) -> None:
    message = str(error.value)
    assert message.startswith(str(path)) and "\n" not in message and len(message) < 600, message
    for fragment in fragments:
        assert fragment in message, message


CRAFTED_TORCH_FILES = {
    "rng code": ("rng_state.pth", RunsCodeWhenUnpickled(), "weights_only loading refuses: Unsupported global"),
    "rng shape": ("rng_state.pth", {"python": "not a state", "numpy": 1, "cpu": 2}, "setstate"),
    "rng bytes": ("rng_state.pth", b"\x1b[2J not a torch file", "cannot be resumed from"),
    "optimizer code": ("optimizer.pt", RunsCodeWhenUnpickled(), "weights_only loading refuses: Unsupported global"),
    "optimizer list": ("optimizer.pt", [1, 2, 3], "not a state dict"),
    "optimizer groups": ("optimizer.pt", {"state": {}, "param_groups": [{"params": [0, 1, 2, 3, 4]}]}, "ValueError"),
    "scheduler code": ("scheduler.pt", RunsCodeWhenUnpickled(), "weights_only loading refuses: Unsupported global"),
    "weights bytes": ("model.safetensors", b"\xff" * 64, "(its model weights) cannot be resumed from"),
}


@pytest.mark.parametrize("case", list(CRAFTED_TORCH_FILES))
def test_crafted_torch_files_are_one_line_naming_the_file(two_steps, tmp_path, case):
    name, content, fragment = CRAFTED_TORCH_FILES[case]
    folder = _crafted(two_steps, tmp_path, name, content)
    trainer, _ = _trainer(folder.parent, max_steps=2)
    with pytest.raises(CheckpointError) as error:
        trainer.train(resume_from_checkpoint="last")
    named = {"optimizer groups": folder / "optimizer.pt", "weights bytes": folder}.get(case, folder / name)
    _assert_one_line(error, named, fragment, "resume from another checkpoint")
    assert "\x1b" not in str(error.value) and RAN == []  # weights_only: the planted pickle ran nothing


@pytest.mark.parametrize("state", [{"global_step": "1"}, {"global_step": -3}, {"global_step": True},
                                   {"log_history": "x"}, {"surprise": 1}, ["not", "an", "object"]],
                         ids=["string step", "negative step", "bool step", "history", "unknown field", "list"])
def test_a_crafted_trainer_state_is_one_line_naming_the_file(two_steps, tmp_path, state):
    original = json.loads((two_steps / "checkpoint-1" / "trainer_state.json").read_text())
    crafted = {**original, **state} if isinstance(state, dict) else state
    folder = _crafted(two_steps, tmp_path, "trainer_state.json", json.dumps(crafted).encode())
    for value in ("last", str(folder)):
        with pytest.raises(CheckpointError) as error:
            resolve_resume_checkpoint(value, str(folder.parent))
        _assert_one_line(error, folder / "trainer_state.json")
    trainer, _ = _trainer(folder.parent, max_steps=1)  # reached max_steps: read before anything loads
    with pytest.raises(CheckpointError):
        trainer.train(resume_from_checkpoint="last")


def test_the_cli_prints_a_crafted_checkpoint_as_one_error_line(two_steps, tmp_path, capsys):
    from ppm_trl import cli

    original = json.loads((two_steps / "checkpoint-1" / "trainer_state.json").read_text())
    folder = _crafted(two_steps, tmp_path, "trainer_state.json", json.dumps({**original, "global_step": "1"}).encode())
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--env_name", "multi_add", "--model_name_or_path", "./no/such/model", "--output_dir",
                  str(folder.parent), "--use_cpu", "true", "--per_device_train_batch_size", "4", "--num_generations",
                  "4", "--resume_from_checkpoint", "last"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err and err.count("error:") == 1
    assert f"{folder / 'trainer_state.json'}: global_step must be int >= 0, got '1'" in err


def test_a_symlinked_checkpoint_or_file_is_refused(two_steps, tmp_path):
    run = tmp_path / "out"
    shutil.copytree(two_steps, run)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(run / "checkpoint-2", elsewhere)
    os.symlink(elsewhere, run / "checkpoint-2")  # the newest checkpoint is a link
    for value in ("last", str(run / "checkpoint-2")):
        with pytest.raises(CheckpointError) as error:
            resolve_resume_checkpoint(value, str(run))
        _assert_one_line(error, run / "checkpoint-2", f"is a symbolic link (to {elsewhere})")
    os.remove(run / "checkpoint-2")
    optimizer = run / "checkpoint-1" / "optimizer.pt"
    optimizer.unlink()
    os.symlink(elsewhere / "optimizer.pt", optimizer)  # a file of the checkpoint is a link
    with pytest.raises(CheckpointError) as error:
        resolve_resume_checkpoint("last", str(run))
    _assert_one_line(error, optimizer, "is a symbolic link")
    optimizer.unlink()
    shutil.copyfile(elsewhere / "optimizer.pt", optimizer)
    os.symlink(elsewhere, run / "checkpoint-2")  # planted where the next save goes: not saved through
    trainer, _ = _trainer(run, max_steps=2)
    with pytest.raises(CheckpointError) as error:
        trainer.train(resume_from_checkpoint=str(run / "checkpoint-1"))
    _assert_one_line(error, run / "checkpoint-2", "is a symbolic link")
    assert sorted(os.listdir(elsewhere)) == sorted(os.listdir(two_steps / "checkpoint-2"))  # untouched


# ------------------------------------------------------------------------------------------ ARG selector state
def _arg_trainer(output_dir: Path, max_steps: int):
    from helpers import TINY_ARGS, script_generation

    from ppm_trl import ARGConfig, ARGTrainer
    from ppm_trl.rewards import accuracy_reward

    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": "3+4?"}]] * 4, "answer": ["7"] * 4,
                              "reference": ["3+4=7 \\boxed{7}"] * 4})
    args = ARGConfig(output_dir=str(output_dir), per_device_train_batch_size=4, num_generations=4,
                     max_completion_length=16, max_steps=max_steps, arg_num_continuations=2, arg_max_accepted=2,
                     arg_max_empty_prefix=2, **{**TINY_ARGS, "save_strategy": "steps", "save_steps": 1})
    trainer = ARGTrainer(model="tiny", reward_funcs=accuracy_reward, train_dataset=data, args=args)
    script_generation(trainer, lambda prompt, index: "8")
    return trainer


@pytest.mark.parametrize("state", [b'{"levels": [0.0, ', b'["a list"]', b'{"levels": "abc", "logits": 1}',
                                   b'{"levels": [0.0, 0.25, 0.5, 0.75], "logits": [0, 0, 0, 0], "baseline": 0.5, '
                                   b'"generator_state": [1, 2, 3]}'],
                         ids=["torn", "list", "wrong types", "bad generator state"])
def test_a_crafted_arg_selector_state_is_one_line_naming_the_file(tmp_path, state):
    from ppm_trl.arg.arg_trainer import SELECTOR_STATE_FILE

    run = tmp_path / "run"
    _arg_trainer(run, max_steps=1).train()
    folder = run / "checkpoint-1"
    (folder / SELECTOR_STATE_FILE).write_bytes(state)
    write_completion_marker(str(folder))
    with pytest.raises(CheckpointError) as error:
        _arg_trainer(run, max_steps=2).train(resume_from_checkpoint="last")
    _assert_one_line(error, folder / SELECTOR_STATE_FILE, "resume from another checkpoint")


def test_the_trainer_state_types_are_transformers_fields():
    from dataclasses import fields

    from transformers import TrainerState

    from ppm_trl.trainers.base import TRAINER_STATE_TYPES

    assert set(TRAINER_STATE_TYPES) <= {field.name for field in fields(TrainerState)}
