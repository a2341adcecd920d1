"""Training that resumes only from a complete checkpoint, saves the method's own state with every checkpoint, and
stops cleanly on a signal.

`train` resumes from the checkpoint `checkpoints.resolve_resume_checkpoint` picks (`True`/`"last"`: the newest
complete one) and trains no step past `max_steps`. Every checkpoint gets the method's `extra_checkpoint_state()` as
JSON files and, written last, its completion marker; on resume the torch files are checked before they are applied
and each bad file is one `CheckpointError` naming it. SIGTERM (a preemption) during `train` is deferred: the step
and any save in progress finish, a checkpoint of that step is saved, and `train` exits with status 143; a second
SIGTERM outside a save stops at once. Ctrl-C (SIGINT) does the same and exits with status 130, with one line
instead of a KeyboardInterrupt traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading

import torch
from transformers import TrainerCallback, TrainerState
from transformers.trainer import OPTIMIZER_NAME, SCALER_NAME, SCHEDULER_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput

from ...judge.redaction import printable
from .checkpoints import (
    CHECKPOINT_COMPLETE,
    TRAINER_STATE,
    CheckpointError,
    checkpoint_problem,
    loading_checkpoint_file,
    reached_max_steps,
    resolve_resume_checkpoint,
    write_completion_marker,
)
from .run_lock import output_dir_lock

_SIGNAL_NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}  # the signals `train` stops cleanly on


class _StopOnSigterm(TrainerCallback):
    """After the optimizer step during which SIGTERM arrived (on any process): save a checkpoint, stop."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        if self.trainer._sigterm_anywhere():
            control.should_save = True
            control.should_training_stop = True


class Preemption:
    """`train` with resume, signals and the method's checkpoint state (mixed into `MethodTrainer`)."""

    _sigterm_received = False  # SIGTERM or Ctrl-C arrived: stop after this step (the name predates Ctrl-C)
    _stop_signal = signal.SIGTERM  # which of the two
    _saving = False

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """TRL's `train`, resuming only from a complete checkpoint (`True`/`"last"`: the newest; see the module
        doc), training no step past `max_steps`, and stopping cleanly on SIGTERM (exit status 143) or Ctrl-C (130)."""
        checkpoint, message = resolve_resume_checkpoint(resume_from_checkpoint, self.args.output_dir)
        if message and self.accelerator.is_main_process:
            print(f"ppm_trl: {message}", file=sys.stderr, flush=True)
        # The step this invocation starts from: what it learned is judged on the steps after it (`nothing_learned`).
        self.first_step_of_this_run = 0 if checkpoint is None else \
            TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE)).global_step
        if checkpoint is not None and reached_max_steps(checkpoint, self.args):
            self._load_from_checkpoint(checkpoint)
            self.state = TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE))
            if self.accelerator.is_main_process:
                print(f"ppm_trl: {os.path.basename(checkpoint)} already reached max_steps "
                      f"({self.state.global_step} steps): nothing to train; the model is loaded from it",
                      file=sys.stderr, flush=True)
            return TrainOutput(self.state.global_step, 0.0, {"train_runtime": 0.0})
        self._sigterm_received = False
        previous = self._install_sigterm_handler()
        stopper = _StopOnSigterm(self)
        self.add_callback(stopper)
        try:
            with output_dir_lock(self.args.output_dir, enabled=self.accelerator.is_main_process):
                result = super().train(checkpoint, *args, **kwargs)
        finally:
            self.remove_callback(stopper)
            for signum, handler in (previous or {}).items():
                signal.signal(signum, handler)
        if self._sigterm_received:
            if self.accelerator.is_main_process:
                print(f"ppm_trl: stopped by {_SIGNAL_NAMES[self._stop_signal]} after step {self.state.global_step}; "
                      f"its checkpoint is saved in {self.args.output_dir} (resume with resume_from_checkpoint=last)",
                      file=sys.stderr, flush=True)
            raise SystemExit(128 + self._stop_signal)
        return result

    def _install_sigterm_handler(self):
        """Defer SIGTERM and Ctrl-C (main thread only; elsewhere signals cannot be handled): {signal: the previous
        handler}, or None."""
        if threading.current_thread() is not threading.main_thread():
            return None

        def on_stop_signal(signum, frame):
            if self._sigterm_received and not self._saving:
                raise SystemExit(128 + signum)  # asked twice: stop now (incomplete checkpoints are never resumed)
            self._sigterm_received, self._stop_signal = True, signum
            name = _SIGNAL_NAMES[signum].encode()
            os.write(2, b"\nppm_trl: " + name + b": finishing this step (and any checkpoint being written), saving a "
                        b"checkpoint, then stopping; a second " + name + b" stops at once\n")  # print() is not reentrant

        return {signum: signal.signal(signum, on_stop_signal) for signum in _SIGNAL_NAMES}

    def _sigterm_anywhere(self) -> bool:
        """Whether any process got SIGTERM (a collective: every process stops after the same step)."""
        if self.accelerator.num_processes == 1:
            return self._sigterm_received
        flag = torch.tensor([float(self._sigterm_received)], device=self.accelerator.device)
        return bool(self.accelerator.gather(flag).max().item())

    def _save_checkpoint(self, model, trial):
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        if os.path.islink(folder):  # planted: removing or rewriting it would act on whatever it points to
            raise CheckpointError(f"{printable(folder)} is a symbolic link (to {printable(os.readlink(folder))}); "
                                  "remove it: checkpoints are saved into real folders only")
        self._saving = True
        try:
            if self.args.should_save and os.path.isdir(folder):
                if checkpoint_problem(folder) is not None:  # an interrupted save of this step: no stale files
                    shutil.rmtree(folder)
                elif os.path.exists(os.path.join(folder, CHECKPOINT_COMPLETE)):
                    os.remove(os.path.join(folder, CHECKPOINT_COMPLETE))  # rewritten below: incomplete meanwhile
            self.accelerator.wait_for_everyone()
            # Written before super(), which may push the checkpoint to the Hub and rotate old ones.
            states = self.extra_checkpoint_state()
            if states and self.args.should_save:
                os.makedirs(folder, exist_ok=True)
                for name, state in states.items():
                    with open(os.path.join(folder, name), "w") as f:
                        json.dump(state, f)
            super()._save_checkpoint(model, trial)
            self.accelerator.wait_for_everyone()  # every process's files (RNG states) are written
            if self.args.should_save and os.path.isdir(folder):
                write_completion_marker(folder)
        finally:
            self._saving = False
        if self._sigterm_anywhere():  # it arrived during the save: stop after it
            self.control.should_training_stop = True

    # Resuming: what a checkpoint's files make the loaders raise (a crafted RNG state, optimizer or selector state)
    # becomes one CheckpointError naming the file. Torch files still load with transformers' `weights_only=True`.
    def _load_from_checkpoint(self, resume_from_checkpoint, *args, **kwargs):
        with loading_checkpoint_file(f"{resume_from_checkpoint} (its model weights)"):
            return super()._load_from_checkpoint(resume_from_checkpoint, *args, **kwargs)

    def _issue_warnings_after_load(self, load_result):
        # transformers 5 leaves a tied weight (lm_head.weight) out of every checkpoint but warns on resume that it is
        # missing: its check reads only `_keys_to_ignore_on_save`. A missing name whose parameter is the same tensor
        # as a loaded one was loaded with it, so only those are left out; a weight really absent is still reported.
        missing = set(load_result.missing_keys)
        names_by_tensor: dict[int, list[str]] = {}
        for name, parameter in self.model.named_parameters(remove_duplicate=False):
            names_by_tensor.setdefault(id(parameter), []).append(name)
        loaded_with_another = {name for names in names_by_tensor.values() if not set(names) <= missing
                               for name in names}
        still_missing = [name for name in load_result.missing_keys if name not in loaded_with_another]
        return super()._issue_warnings_after_load(load_result._replace(missing_keys=still_missing))

    def _load_rng_state(self, checkpoint):
        if checkpoint is None:
            return super()._load_rng_state(checkpoint)
        # the file transformers reads: one per process when distributed
        name = f"rng_state_{self.args.process_index}.pth" if self.args.world_size > 1 else "rng_state.pth"
        with loading_checkpoint_file(os.path.join(checkpoint, name)):
            return super()._load_rng_state(checkpoint)

    def _load_optimizer_and_scheduler(self, checkpoint):
        if checkpoint is None:
            return super()._load_optimizer_and_scheduler(checkpoint)
        for name in (OPTIMIZER_NAME, SCHEDULER_NAME, SCALER_NAME):  # which file is bad, before they are applied
            path = os.path.join(checkpoint, name)
            if os.path.isfile(path):
                with loading_checkpoint_file(path):
                    if not isinstance(torch.load(path, map_location="cpu", weights_only=True, mmap=True), dict):
                        raise TypeError("not a state dict")
        with loading_checkpoint_file(os.path.join(checkpoint, f"{OPTIMIZER_NAME} or {SCHEDULER_NAME}")):
            super()._load_optimizer_and_scheduler(checkpoint)
        states = {}
        for name in self.extra_checkpoint_state():
            path = os.path.join(checkpoint, name)
            if os.path.exists(path):
                with loading_checkpoint_file(path), open(path, encoding="utf-8") as f:
                    states[name] = json.load(f)
        with loading_checkpoint_file(", ".join(os.path.join(checkpoint, name) for name in states) or checkpoint):
            self.load_extra_checkpoint_state(states)
