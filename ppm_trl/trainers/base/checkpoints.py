"""Checkpoint folders as files: when one is complete, which one to resume from, and what in it can be trusted.

A checkpoint folder counts only when complete — its last file is a `CHECKPOINT_COMPLETE` marker listing every file's
size (a folder without one, from an older version, needs a readable trainer_state.json).
`resume_from_checkpoint=True` / `"true"` / `"last"` takes the newest complete one and says which (and which it
skipped); a checkpoint that already reached `max_steps` trains no further step. A resumed checkpoint's own files are
untrusted input: a trainer_state.json field of the wrong type, a torch file that `weights_only` refuses or that does
not fit (RNG state, optimizer, scheduler, weights), a method state that does not load (ARG's selector), a symbolic
link for a folder or file: each is one `CheckpointError` naming the file. The trainer side (saving, loading,
stopping on a signal) is `preemption.py`.
"""

from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from dataclasses import fields

from transformers import TrainerState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ...judge.redaction import printable

CHECKPOINT_COMPLETE = "ppm_trl_checkpoint_complete.json"  # written last: {"files": {relative path: bytes}}
TRAINER_STATE = "trainer_state.json"
_CHECKPOINT_NAME = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
RESUME_LAST = ("true", "last")  # resume_from_checkpoint values meaning "the newest complete checkpoint"


def checkpoint_problem(folder: str) -> str | None:
    """Why `folder` is not a complete checkpoint (None: it is). With our marker: every file it lists is there with
    its size; without (an older version's folder): trainer_state.json, the last file transformers writes, parses."""
    marker = os.path.join(folder, CHECKPOINT_COMPLETE)
    if os.path.exists(marker):
        try:
            with open(marker) as f:
                files = dict(json.load(f)["files"])
        except (OSError, ValueError, KeyError, TypeError):
            return f"its {CHECKPOINT_COMPLETE} is unreadable"
        for name, size in sorted(files.items()):
            path = os.path.join(folder, name)
            if not os.path.isfile(path):
                return f"{name} is missing"
            if os.path.getsize(path) != size:
                return f"{name} has {os.path.getsize(path)} bytes, {size} when saved"
        return None
    try:
        with open(os.path.join(folder, TRAINER_STATE)) as f:
            json.load(f)
    except FileNotFoundError:
        return f"no {TRAINER_STATE} (its save was interrupted)"
    except (OSError, ValueError):
        return f"{TRAINER_STATE} is unreadable (its save was interrupted)"
    return None


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from: a file damaged, edited or crafted (its content, not an interrupted
    save). One line naming the file (the CLI prints it as `error:`); the original exception is its cause."""


_FIX = "resume from another checkpoint (or train without resume_from_checkpoint)"
_NUMBER = (int, float)
_NONE = type(None)
# trainer_state.json as transformers reads it back (TrainerState's fields, as JSON types): it computes with these on
# resume, so a string `global_step` would otherwise surface as a TypeError deep in the training loop.
TRAINER_STATE_TYPES = {
    "epoch": _NUMBER, "global_step": int, "max_steps": int, "logging_steps": _NUMBER, "eval_steps": _NUMBER,
    "save_steps": _NUMBER, "train_batch_size": (int, _NONE), "num_train_epochs": _NUMBER,
    "num_input_tokens_seen": _NUMBER, "total_flos": _NUMBER, "log_history": (list, _NONE),
    "best_metric": (*_NUMBER, _NONE), "best_global_step": (int, _NONE), "best_model_checkpoint": (str, _NONE),
    "is_local_process_zero": bool, "is_world_process_zero": bool, "is_hyper_param_search": bool,
    "trial_name": (str, _NONE), "trial_params": (dict, _NONE), "stateful_callbacks": (dict, _NONE),
}


def _reason(error: BaseException) -> str:
    """An exception as a short printable line (torch's unpickling errors run to paragraphs; a crafted file chooses
    the names they quote)."""
    lines = [line.strip() for line in str(error).strip().splitlines()]
    # weights_only's refusal says what it refused on a later line, after advice on how to load the file anyway
    refused = [line.split("WeightsUnpickler error:", 1)[1] for line in lines if "WeightsUnpickler error:" in line]
    if refused:
        return printable(f"a pickle torch's weights_only loading refuses:{refused[0][:200]}")
    return printable(f"{type(error).__name__}: {lines[0][:200] if lines else ''}")


@contextmanager
def loading_checkpoint_file(path: str):
    """Whatever loading `path` raises becomes one `CheckpointError` naming it."""
    try:
        yield
    except CheckpointError:
        raise
    except Exception as error:
        raise CheckpointError(f"{printable(path)} cannot be resumed from ({_reason(error)}): it is damaged, edited "
                              f"or was not written by this trainer; {_FIX}") from error


def read_trainer_state(checkpoint: str) -> dict:
    """The checkpoint's trainer_state.json, its fields of the types transformers computes with (`CheckpointError`
    naming the file and the field otherwise)."""
    path = os.path.join(checkpoint, TRAINER_STATE)
    with loading_checkpoint_file(path):
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is not a JSON object; {_FIX}")
    known = {field.name for field in fields(TrainerState)}  # TrainerState(**state) refuses any other
    for name, value in state.items():
        if name not in known:
            raise CheckpointError(f"{path} has an unknown field {printable(repr(name))[:80]}; {_FIX}")
        expected = TRAINER_STATE_TYPES.get(name)
        if expected is None:  # a field of a newer transformers: its own loader checks it
            continue
        is_number_from_bool = isinstance(value, bool) and expected is not bool
        if is_number_from_bool or not isinstance(value, expected) or (expected is int and value < 0):
            kinds = " or ".join("null" if kind is _NONE else kind.__name__
                                for kind in (expected if isinstance(expected, tuple) else (expected,)))
            raise CheckpointError(f"{path}: {name} must be {kinds}{' >= 0' if expected is int else ''}, got "
                                  f"{printable(repr(value))[:80]}; {_FIX}")
    return state


def check_checkpoint_contents(checkpoint: str) -> None:
    """`CheckpointError` for a checkpoint that is a symbolic link or holds one (a link could point anywhere, and
    saving or rotating checkpoints would delete through it) or whose trainer_state.json is not what transformers
    writes; the torch files are checked as they load (`preemption.py`)."""
    for path in (checkpoint, *(entry.path for entry in os.scandir(checkpoint))):
        if os.path.islink(path):
            raise CheckpointError(f"{printable(path)} is a symbolic link (to {printable(os.readlink(path))}): a "
                                  "checkpoint must be a real folder of real files; copy it in its place, or pass "
                                  "the folder it points to")
    read_trainer_state(checkpoint)


def write_completion_marker(folder: str) -> None:
    """List every file of a finished checkpoint with its size in `CHECKPOINT_COMPLETE`, atomically, last."""
    files = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            if name != CHECKPOINT_COMPLETE and not name.startswith(f".{CHECKPOINT_COMPLETE}"):
                files[os.path.relpath(path, folder)] = os.path.getsize(path)
    temporary = os.path.join(folder, f".{CHECKPOINT_COMPLETE}.{os.getpid()}")
    with open(temporary, "w") as f:
        json.dump({"files": files}, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, os.path.join(folder, CHECKPOINT_COMPLETE))


def resolve_resume_checkpoint(value, output_dir: str) -> tuple[str | None, str | None]:
    """(checkpoint folder or None, what to tell the user) for a `resume_from_checkpoint` value: None/False/"false"
    → no resume; True/"true"/"last" → the newest complete `checkpoint-N` of `output_dir` (naming the incomplete ones
    it skipped); a path → itself, if complete. ValueError (one line, with the fix) otherwise."""
    if value is None or value is False or str(value).strip().lower() in ("", "false", "none"):
        return None, None
    if value is True or str(value).strip().lower() in RESUME_LAST:
        found = []
        if os.path.isdir(output_dir):
            found = sorted(((int(m[1]), name) for name in os.listdir(output_dir)
                            if (m := _CHECKPOINT_NAME.match(name)) and os.path.isdir(os.path.join(output_dir, name))),
                           reverse=True)
        skipped = []
        for _, name in found:
            problem = checkpoint_problem(os.path.join(output_dir, name))
            if problem is None:
                why = f"newest complete; skipped {'; '.join(skipped)}" if skipped else "the newest"
                check_checkpoint_contents(os.path.join(output_dir, name))
                return os.path.join(output_dir, name), f"resuming from {name} ({why})"
            skipped.append(f"{name}: incomplete, {problem}")
        raise ValueError(f"resume_from_checkpoint={value}: no complete checkpoint in output_dir {output_dir!r}"
                         + (f" ({'; '.join(skipped)})" if skipped else "")
                         + "; train without resume_from_checkpoint, or pass a checkpoint folder")
    path = os.fspath(value)
    if not os.path.isdir(path):
        raise ValueError(f"resume_from_checkpoint={path!r}: no such checkpoint folder; pass `last` for the newest "
                         "complete checkpoint of output_dir")
    problem = checkpoint_problem(path)
    if problem is not None:
        raise ValueError(f"resume_from_checkpoint={path!r} is incomplete: {problem}; pass `last` for the newest "
                         "complete checkpoint of output_dir")
    check_checkpoint_contents(path)
    return path, None


def reached_max_steps(checkpoint: str, args) -> bool:
    """Whether the run saved in `checkpoint` already did every optimizer step `args` asks for (transformers would
    train one more: it checks max_steps only after a step)."""
    state = read_trainer_state(checkpoint)
    done = state.get("global_step", 0)
    if args.max_steps > 0:
        return done >= args.max_steps
    return state.get("max_steps", 0) > 0 and done >= state["max_steps"] \
        and state.get("num_train_epochs") == args.num_train_epochs
