"""MethodTrainer: the one seam with TRL's GRPOTrainer. Only this module names TRL's (and Trainer's) private members.

It overrides each TRL hook once and gives the method trainers public, documented hooks instead:

- `on_rollout(rollout) -> Rollout` — after TRL generated (and decoded) the rows, before anything is scored: the rows
  may be replaced (ARG). The base then recomputes TRL's completion statistics so that they describe the FINAL rows.
- `on_final_rollout(rollout) -> pending` — training only, after every `on_rollout` of the MRO: the rows are final
  and TRL's log-prob passes come next. Start slow scoring here (`run_in_background`) and RETURN what the advantage
  hook needs to collect it (PPM: the scored ids, prefix lengths and Future; PAPO: the early outcome, the judged rows and the
  Future); the base keeps it for this batch only and hands it over as `ScoredBatch.pending`.
- `compute_advantages(batch: ScoredBatch) -> Advantages | None` — after TRL computed its own advantages; `batch`
  holds everything the step knows by then, built once by the base: this process's rows, completions and completion
  ids, the gathered rewards and weighted outcome, this process's masks, its slice of the gathered batch (`local`)
  and the pending work. The method's (B,) or per-segment (B, K) values on the gathered batch: the base slices them
  to this process, expands segments to tokens, removes dropped rows from the loss (recounting
  `num_items_in_batch`) and replaces TRL's logged advantages. Hooks keep nothing on `self` between them (a
  subclass that still defines the removed `on_scores` hook, or the old `compute_advantages(completion_mask,
  tool_mask)`, is refused at construction).
- `extra_checkpoint_state()` / `load_extra_checkpoint_state(states)` — JSON files saved with every checkpoint.

`MethodTrainer.__init__` checks the reward functions' dataset columns and resolves the model path ("tiny", a local
directory made absolute) once per trainer, however many method classes a composed trainer's MRO runs; each method's
`__init__` checks only its own columns and config.

Checkpoints and preemption (`train`): a checkpoint folder counts only when complete — its last file is a
`CHECKPOINT_COMPLETE` marker listing every file's size (a folder without one, from an older version, needs a
readable trainer_state.json). `resume_from_checkpoint=True` / `"true"` / `"last"` takes the newest complete one
and says which (and which it skipped); a checkpoint that already reached `max_steps` trains no further step.
A resumed checkpoint's own files are untrusted input: a trainer_state.json field of the wrong type, a torch file
that `weights_only` refuses or that does not fit (RNG state, optimizer, scheduler, weights), a method state that
does not load (ARG's selector), a symbolic link for a folder or file: each is one `CheckpointError` naming the file.
SIGTERM (a preemption) during `train` is deferred: the step and any save in progress finish, a checkpoint of
that step is saved, and `train` exits with status 143; a second SIGTERM outside a save stops at once. Ctrl-C
(SIGINT) does the same and exits with status 130, with one line instead of a KeyboardInterrupt traceback.

Hub uploads (`push_to_hub`, and the pushes during training with `push_to_hub=True`) leave out the files a run
keeps for itself in `output_dir` (`run_private_patterns`: the judge cache with its answers and `api_base`,
`quarantine.jsonl` with dataset text, the untrained tiny model): Trainer uploads `output_dir` with a fixed
`ignore_patterns` and no argument to extend it, so during a push the `hf_api()` it calls (`HUB_API`) gives an
`upload_folder` that adds them.

And public helpers: `sample_completion_ids` (the generation backend; tests script it), `generate_token_ids` (prompt
ids with a max_tokens per row through the trainer's own backend: HF, vLLM colocate or server), `outcome_rewards`
(the reward functions alone), `compute_rewards_early` (the final rows' rewards before the log-prob passes, reused
by TRL's reward pass), `sequence_logprobs` (a no-grad forward), `log_metric`, `tokenizer`, `is_multimodal`,
`decode_completions`, `current_rollout`, `local_rows`, `run_in_background`; and TRL's state a method reads, by name:
`outcome_reward_weights`, `eos_ids`, `masks_truncated_completions`. `save_model` also writes the method's model card
(from the class attributes `_name`, `_paper`, `_tag_names`, TRL's documented model-card attributes).

The seam is closed (`tests/test_trl_seam.py`): outside this module, no code names a TRL/Trainer private member or
passes a private parameter, imports from a TRL submodule what `trl` does not export, reads trainer state TRL sets
but does not document (only `DOCUMENTED_TRAINER_STATE`), or writes into an object TRL owns.

The order inside TRL 1.16's `GRPOTrainer._generate_and_score_completions`, which the hooks hang on:
1. `_generate(prompts)` (→ `on_rollout`, then `on_final_rollout`) and padding into tensors;
2. under no_grad, the old-policy log-probs (only when `gradient_accumulation_steps % (steps_per_generation ×
   num_iterations) != 0`, or vLLM importance sampling) and the reference model's (only when `beta != 0`);
3. `_calculate_rewards`, then TRL's advantages (→ `compute_advantages`).
Work started in step 1 therefore runs during step 2 and is collected in step 3.

Supported TRL: `TRL_SUPPORTED` (checked at import; `tests/test_trl_seam.py` checks every private signature used).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import re
import shutil
import signal
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import trl
from packaging.specifiers import SpecifierSet
from packaging.version import Version

TRL_SUPPORTED = SpecifierSet(">=1.16,<1.17")
if Version(trl.__version__) not in TRL_SUPPORTED:
    raise ImportError(
        f"ppm_trl's trainers support trl{TRL_SUPPORTED} but trl {trl.__version__} is installed: the base trainer "
        f"(ppm_trl/trainers/base.py) relies on GRPOTrainer internals of those versions. Install `trl{TRL_SUPPORTED}`."
    )

from accelerate.utils import broadcast_object_list, gather_object  # noqa: E402
from transformers import TrainerCallback, TrainerState  # noqa: E402
from transformers.trainer import OPTIMIZER_NAME, SCALER_NAME, SCHEDULER_NAME  # noqa: E402
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput  # noqa: E402
from trl import GRPOTrainer  # noqa: E402
from trl.chat_template_utils import parse_response  # noqa: E402
from trl.data_utils import is_conversational  # noqa: E402
from trl.models.utils import disable_gradient_checkpointing  # noqa: E402
from trl.trainer.utils import get_config_model_id, pad  # noqa: E402

from ..judge.client import printable  # noqa: E402
from ..judge.quarantine import QUARANTINE_FILE  # noqa: E402
from ..segments import expand_segment_values  # noqa: E402
from .common import check_reward_columns, resolve_model_path, weighted_outcome  # noqa: E402

logger = logging.getLogger(__name__)

# The private TRL / Trainer members this module uses, with the leading parameters it passes (checked by
# tests/test_trl_seam.py: each tuple must be the start of the member's signature).
TRL_PRIVATE_METHODS = {
    "_generate": ("self", "prompts"),
    "_generate_single_turn": ("self", "prompt_ids", "images", "multimodal_fields", "num_generations",
                              "has_tool_images"),
    "_generate_and_score_completions": ("self", "inputs"),
    "_calculate_rewards": ("self", "inputs", "prompts", "completions", "completion_ids_list"),
    # returns (logps, entropies, aux_loss)
    "_get_per_token_logps_and_entropies": ("self", "model", "input_ids", "attention_mask", "logits_to_keep",
                                           "batch_size"),
    "_get_output_dir": ("self", "trial"),
    "_save_checkpoint": ("self", "model", "trial"),
    "_load_optimizer_and_scheduler": ("self", "checkpoint"),
    "_load_from_checkpoint": ("self", "resume_from_checkpoint"),
    "_push_from_checkpoint": ("self", "checkpoint_folder"),
    "_load_rng_state": ("self", "checkpoint"),
}
# Private parameters of public transformers / TRL methods this module passes (checked like TRL_PRIVATE_METHODS).
TRL_PRIVATE_PARAMETERS = {
    "save_model": ("self", "output_dir", "_internal_call"),
}
# Names this module imports from TRL submodules although `trl` does not export them (checked by the seam test: they
# exist, and no other module imports from a TRL submodule what `trl` itself does not export).
TRL_SUBMODULE_IMPORTS = {
    "trl.chat_template_utils": ("parse_response",),
    "trl.data_utils": ("is_conversational",),
    "trl.models.utils": ("disable_gradient_checkpointing",),
    "trl.trainer.utils": ("get_config_model_id", "pad"),
}
# Trainer state (attributes TRL / transformers set on the trainer) that code outside this module may read directly,
# besides Trainer's documented "Important attributes" and the constructor arguments kept under their own name: why
# each is safe. Any other state TRL sets is read through an accessor of MethodTrainer (`outcome_reward_weights`,
# `eos_ids`, `masks_truncated_completions`, ...). Checked by tests/test_trl_seam.py.
DOCUMENTED_TRAINER_STATE = {
    "state": "the TrainerState every TrainerCallback receives (transformers' callback API)",
    "control": "the TrainerControl every TrainerCallback receives (transformers' callback API)",
    "accelerator": "transformers' Accelerate integration (process index, gather, device); documented in its guides",
    "callback_handler": "holds the callbacks that Trainer.add_callback / pop_callback / remove_callback edit",
    "num_generations": "GRPO's group size G, `args.num_generations` as given (the seam test checks they are equal)",
}
TRL_PRIVATE_ATTRIBUTES = ("_tokenizer", "_is_vlm", "_logs", "_metrics", "_pending_metrics", "_pending_extra_logs")
# `vllm_generation` (only with use_vllm): its `max_completion_length`, `llm` (colocate) and `vllm_client` (server).
VLLM_GENERATION_ATTRIBUTES = ("max_completion_length", "llm", "vllm_client")
COMPLETION_STATISTICS = ("completions/mean_length", "completions/min_length", "completions/max_length",
                         "completions/clipped_ratio", "completions/mean_terminated_length",
                         "completions/min_terminated_length", "completions/max_terminated_length")


# Where Trainer's pushes get their HfApi: (module, function). Replaced only for the duration of a push
# (`_uploads_ignoring`); tests/test_hub_upload.py checks the files an upload takes end to end.
HUB_API = ("transformers.trainer", "hf_api")
# Files a run writes into output_dir for itself, as huggingface_hub `ignore_patterns` relative to output_dir (a trailing
# "/" covers a folder's files): never part of a Hub upload. The judge cache's configured place is added per run.
RUN_PRIVATE_FILES = (
    "judge_cache/",  # the default judge_cache_dir: every judge answer, and the api_base it came from
    QUARANTINE_FILE,  # dataset text of the rows the judge could not score
    "initial_tiny_model*/",  # `model="tiny"`: the untrained starting weights, not the trained model
)
# The judge cache's own layout (ppm_trl/judge/cache.py, claims.py), for a judge_cache_dir that is output_dir itself.
_JUDGE_CACHE_LAYOUT = ("[0-9a-f][0-9a-f]/", "claims/")

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
def _loading_checkpoint_file(path: str):
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
    with _loading_checkpoint_file(path):
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
    writes; the torch files are checked as they load (`MethodTrainer`)."""
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


def run_private_patterns(args) -> list[str]:
    """`RUN_PRIVATE_FILES`, plus a `judge_cache_dir` configured inside `args.output_dir` (relative to it)."""
    patterns = list(RUN_PRIVATE_FILES)
    cache = getattr(args, "judge_cache_dir", None)
    if cache and str(cache).lower() != "none":
        relative = os.path.relpath(os.path.abspath(cache), os.path.abspath(args.output_dir))
        if relative == ".":
            patterns.extend(_JUDGE_CACHE_LAYOUT)
        elif not relative.startswith(os.pardir):  # outside output_dir it is never uploaded
            patterns.append(Path(relative).as_posix() + "/")
    return patterns


@contextmanager
def _uploads_ignoring(patterns: list[str]):
    """While in the block, the Hub uploads Trainer makes also skip `patterns` (huggingface_hub's `ignore_patterns`
    of `upload_folder`). Trainer passes a fixed list and offers no way to extend it; its `hf_api()` is swapped for
    the block only, and every other call goes to the shared HfApi unchanged."""
    import importlib

    module = importlib.import_module(HUB_API[0])
    shared = getattr(module, HUB_API[1])

    class Uploader:
        def __getattr__(self, name):
            return getattr(shared(), name)

        def upload_folder(self, **kwargs):
            ignored = kwargs.get("ignore_patterns") or []
            ignored = [ignored] if isinstance(ignored, str) else list(ignored)
            return shared().upload_folder(**{**kwargs, "ignore_patterns": [*ignored, *patterns]})

    uploader = Uploader()
    setattr(module, HUB_API[1], lambda: uploader)
    try:
        yield
    finally:
        setattr(module, HUB_API[1], shared)


_SIGNAL_NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}  # the signals `train` stops cleanly on


class _StopOnSigterm(TrainerCallback):
    """After the optimizer step during which SIGTERM arrived (on any process): save a checkpoint, stop."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        if self.trainer._sigterm_anywhere():
            control.should_save = True
            control.should_training_stop = True


class RunReport(TrainerCallback):
    """When `train` ends (not stopped by a signal), on the main process: `ppm_trl: done {summary}` on stdout — steps,
    loss, output dir, step times, the mean of the method's metrics (`ppm_trl.report.training_summary`) — and, when
    no gradient reached the model, `ppm_trl: warning: nothing was learned: <why>` on stderr (the rule `ppm-trl train`
    uses, `ppm_trl.report.nothing_learned`). `trainer.remove_callback(RunReport)` silences both."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_train_end(self, args, state, control, **kwargs):
        trainer = self.trainer
        if trainer._sigterm_received or not state.is_world_process_zero:  # a stop says so itself
            return
        from ..methods import method_of_trainer
        from ..report import nothing_learned, training_summary

        method = method_of_trainer(type(trainer))
        summary = training_summary(trainer, None, method.name if method else type(trainer).__name__)
        print("ppm_trl: done " + json.dumps(summary), flush=True)
        problem = nothing_learned(state.log_history, args)
        if problem:
            print(f"ppm_trl: warning: nothing was learned: {problem}", file=sys.stderr, flush=True)


@dataclass
class Rollout:
    """One generation batch of this process, by name (TRL's `_generate` returns these as an 8-tuple)."""

    rows: list[dict]  # the dataset rows (TRL's `inputs`)
    prompts: list  # the prompts as TRL passed them to generation (text or messages)
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    tool_mask: list[list[int]] | None  # 1 = model token, 0 = tool/env output; None without tools
    completions: list  # decoded (text or assistant messages)
    logprobs: list[list[float | None]] | None  # sampling log-probs per token (vLLM), None (HF generate)
    extra_fields: dict
    images: Any
    tool_images: Any


@dataclass(frozen=True)
class ScoredBatch:
    """One generation batch of this process after TRL's rewards: what `compute_advantages` receives (training only).
    Rows, completions, ids and masks are this process's (B_local); rewards and outcome are gathered (B_global)."""

    rows: list[dict]  # the dataset rows TRL rewarded (with a rollout_func's extra fields)
    completions: list  # decoded (text or assistant messages)
    completion_ids: list[list[int]]
    rewards_per_func: torch.Tensor  # (B_global, F), NaN where a reward function returned None
    outcome: torch.Tensor  # (B_global,) Σ_f w_f·r_f (`weighted_outcome`), NaN where every function returned None
    completion_mask: torch.Tensor  # (B_local, T)
    tool_mask: torch.Tensor | None  # (B_local, T) 1 = model token; None without tools
    local: slice  # this process's rows within the gathered batch (`MethodTrainer.local_rows`)
    pending: Any = None  # what `on_final_rollout` returned for this batch (None: nothing started early)


@dataclass
class Advantages:
    """A method's advantages on the gathered batch (B_global rows)."""

    values: torch.Tensor  # (B,) per row, or (B, K) per segment with `segment_ids`
    segment_ids: torch.Tensor | None = None  # (B_local, T) segment index of each local token (for (B, K) values)
    logged: torch.Tensor | None = None  # (B,) one scalar per row for the completions table (default: `values`)
    dropped: torch.Tensor | None = None  # (B,) rows removed from the loss; not None → `num_items_in_batch` recounted


def completion_statistics(lengths: torch.Tensor, truncated: torch.Tensor) -> dict[str, float]:
    """TRL's completion metrics (gathered lengths, truncated = not ended by EOS/pad), as TRL computes them."""
    lengths = lengths.float()
    terminated = lengths[~truncated]
    if len(terminated) == 0:  # TRL's convention: no terminated row → 0
        terminated = torch.zeros(1, device=lengths.device)
    values = (lengths.mean(), lengths.min(), lengths.max(), truncated.float().mean(),
              terminated.mean(), terminated.min(), terminated.max())
    return {name: value.item() for name, value in zip(COMPLETION_STATISTICS, values)}


def plan_generation_calls(budgets: list[int], rooms: list[int | None]) -> list[tuple[int, list[int]]]:
    """Group rows into generation calls so that no request asks for more tokens than the engine allows.

    `budgets[i]` is row i's token budget, `rooms[i]` what the engine's max_model_len leaves after its prompt
    (None: no limit, HF generate). A call with max_tokens M serves row i exactly when min(budget, room) ≤ M ≤ room
    (rows are cut to their budget afterwards, the same distribution as stopping there). Returns [(M, rows)]: ONE
    call when every room holds the largest budget (the usual case), else one call per run of rows that fit.
    """
    wanted = [b if r is None else min(b, r) for b, r in zip(budgets, rooms)]
    pending = sorted(range(len(budgets)), key=lambda i: (-wanted[i], i))
    calls = []
    while pending:
        max_tokens = wanted[pending[0]]
        fits = [i for i in pending if rooms[i] is None or rooms[i] >= max_tokens]
        calls.append((max_tokens, sorted(fits)))
        pending = [i for i in pending if i not in set(fits)]
    return calls


# TRL's fields a card records besides the method's own (`card_training_record`).
CARD_TRL_SETTINGS = ("learning_rate", "lr_scheduler_type", "warmup_steps", "num_generations",
                     "per_device_train_batch_size", "gradient_accumulation_steps", "max_completion_length",
                     "max_steps", "num_train_epochs", "temperature", "beta", "loss_type", "epsilon", "epsilon_high",
                     "scale_rewards", "num_iterations", "seed")
# The judge's settings a card records when a judge scored the run (never `judge_api_base`: it may hold credentials).
CARD_JUDGE_SETTINGS = ("judge_model", "judge_transport", "judge_temperature")


def card_training_record(trainer, dataset_name: str | None = None) -> dict:
    """What the run was, for its model card: method, dataset, reward functions (with weights), the judge model
    (None when no judge scored), and the settings — every field of the method's config that TRL's GRPOConfig does
    not have (judge fields only with a judge) and TRL's main ones (`CARD_TRL_SETTINGS`). Plain JSON values."""
    from trl import GRPOConfig

    from ..methods import method_of_trainer
    from ..scorers import scorer_judge

    method = method_of_trainer(type(trainer))
    args = trainer.args
    values = json.loads(json.dumps(args.to_dict(), default=str))
    judge = next((j for j in (scorer_judge(getattr(trainer, name, None)) for name in ("progress_scorer",
                                                                                       "process_scorer")) if j), None)
    trl_fields = {f.name for f in fields(GRPOConfig)}
    own = [f.name for f in fields(type(args)) if f.name not in trl_fields
           and (judge is not None or not f.name.startswith("judge_"))]
    if judge is not None:
        own = [name for name in own if not name.startswith("judge_") or name in CARD_JUDGE_SETTINGS]
    settings = {name: values[name] for name in (*CARD_TRL_SETTINGS, *own) if name in values}
    weights = trainer.outcome_reward_weights.tolist()
    return {
        "method": method.name if method else type(trainer).__name__,
        "dataset": dataset_name or trainer.model_card_dataset or describe_dataset(trainer.train_dataset),
        "reward_funcs": [{"name": name, "weight": weight} for name, weight in zip(trainer.reward_func_names, weights)],
        "judge_model": getattr(judge, "model", None) if judge is not None else None,
        "settings": settings,
    }


def describe_dataset(dataset) -> str | None:
    """A synthetic env's name and horizon (its `env` and `n` columns), a Hub dataset's name, else None."""
    if dataset is None or not hasattr(dataset, "column_names"):
        return None
    columns = dataset.column_names or []
    if "env" in columns and hasattr(dataset, "__len__") and len(dataset):
        row = dataset[0]
        return f"ppm_trl synthetic env `{row['env']}`" + (f", n = {row['n']}" if "n" in columns else "") + \
            f" ({len(dataset)} problems)"
    name = getattr(getattr(dataset, "info", None), "dataset_name", None)
    return str(name) if name else None


def base_model_license(base: str | None) -> dict | None:
    """{"license", "license_name"?, "license_link"?} that the base model's own card declares — a local directory's
    README.md, or a Hub model's from the local Hub cache (or the Hub, unless HF_HUB_OFFLINE) — or None."""
    if not base:
        return None
    from huggingface_hub import ModelCard, constants, hf_hub_download, try_to_load_from_cache

    path = os.path.join(base, "README.md") if os.path.isdir(base) else None
    if path is None:
        try:
            cached = try_to_load_from_cache(base, "README.md")
            path = cached if isinstance(cached, str) else (
                None if constants.HF_HUB_OFFLINE else hf_hub_download(base, "README.md"))
        except Exception:  # not a Hub id, no card, no network: no licence known
            return None
    if not path or not os.path.isfile(path):
        return None
    try:
        data = ModelCard.load(path).data
    except Exception:  # an unreadable card says nothing
        return None
    licence = data.get("license")
    if not isinstance(licence, str) or not licence.strip() or licence in ("license", "unknown"):
        return None
    return {"license": licence, **{key: data.get(key) for key in ("license_name", "license_link") if data.get(key)}}


def render_training_record(record: dict, licence: str, source: str | None) -> str:
    """The card section for `card_training_record`'s record."""
    rewards = ", ".join(f"`{r['name']}` (weight {r['weight']:g})" for r in record["reward_funcs"]) or "none"
    settings = ", ".join(f"`{name}`: {json.dumps(value)}" for name, value in record["settings"].items())
    unknown = " (no licence known: set one with `--license` or `create_model_card(license=...)`)"
    licence_line = f"`{licence}`" + (f" ({source})" if source else unknown)
    return ("### Training data, rewards and settings\n\n"
            f"- Method: `{record['method']}`\n"
            f"- Dataset: {record['dataset'] or 'not recorded'}\n"
            f"- Reward functions: {rewards}\n"
            f"- Judge model: {'`' + record['judge_model'] + '`' if record['judge_model'] else 'none (no LLM judge)'}\n"
            f"- Licence: {licence_line}\n"
            f"- Settings: {settings}\n\n")



class MethodTrainer(GRPOTrainer):
    """GRPOTrainer with public hooks for a method's rollouts, scores, advantages and checkpoint state."""

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, **kwargs):
        # TRL reads `_name`, `_paper` and `_tag_names` for the model card (and the tags in __init__): the method's
        # registry record says them (`ppm_trl.methods.Method.model_card`), unless a subclass of the registered
        # trainer sets its own.
        from ..methods import method_of_trainer
        from .common import registered_model_card

        if any("on_scores" in vars(k) for k in type(self).__mro__):
            raise TypeError(f"{type(self).__name__}.on_scores: this hook is gone; read what it received from the "
                            "ScoredBatch that `compute_advantages(batch)` gets (rows, completions, gathered rewards "
                            "and outcome, masks, this process's slice, the pending work of `on_final_rollout`)")
        try:
            inspect.signature(self.compute_advantages).bind(None)
        except TypeError:
            raise TypeError(f"{type(self).__name__}.compute_advantages must take one argument, the ScoredBatch "
                            "(`compute_advantages(self, batch)`); the masks are `batch.completion_mask` and "
                            "`batch.tool_mask`") from None
        for attribute, value in registered_model_card(type(self)).items():
            setattr(self, attribute, value)
        # Once per trainer, however many method classes its MRO composes.
        method = method_of_trainer(type(self))
        check_reward_columns(train_dataset, reward_funcs, method.name.upper() if method else type(self).__name__)
        if args is None:
            args = self.default_config(model)
        model = resolve_model_path(model, args)  # "tiny", or a local directory made absolute
        super().__init__(model, reward_funcs, args=args, train_dataset=train_dataset, **kwargs)
        self.add_callback(RunReport(self))

    @classmethod
    def default_config(cls, model):
        """The method's config with its defaults, for a trainer built without `args` — as GRPOTrainer builds
        `GRPOConfig("<model name>-GRPO")`: output_dir `<model name>-<METHOD>` (`Qwen3-1.7B-PPM`, `tiny-PPM-ARG`).
        One departure, as `ppm-trl train` makes it: bf16 only where a GPU supports it (TRL's default, bf16 on,
        refuses to build on a CPU)."""
        from ..methods import method_of_trainer

        method = method_of_trainer(cls)
        if method is None:
            raise ValueError(f"{cls.__name__} is no registered method's trainer: pass its config as `args`")
        name = model if isinstance(model, str) else get_config_model_id(model.config)
        name = str(name).rstrip("/").split("/")[-1]
        bf16 = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        return method.config_class()(output_dir=f"{name}-{method.name.upper().replace('+', '-')}", bf16=bf16)

    # ------------------------------------------------------------------------------------------ public hooks
    def on_rollout(self, rollout: Rollout) -> Rollout:
        """Called after every generation (training and eval); return the rollout, rows replaced or not."""
        return rollout

    def on_final_rollout(self, rollout: Rollout) -> Any:
        """Called in training after every `on_rollout`, before TRL's log-prob passes: the rows are final. Work that
        only needs the completions (the judge) can start here with `run_in_background`; return what collects it,
        which `compute_advantages` receives as `batch.pending`. Evaluation never calls it."""
        return None

    def compute_advantages(self, batch: ScoredBatch) -> Advantages | None:
        """Called in training after TRL computed its advantages; None keeps TRL's."""
        return None

    def extra_checkpoint_state(self) -> dict[str, Any]:
        """{file name: JSON-able state} written into every checkpoint folder."""
        return {}

    def load_extra_checkpoint_state(self, states: dict[str, Any]) -> None:
        """Restore from {file name: state} read from the resumed checkpoint (files it lacks are absent)."""

    # ---------------------------------------------------------------------------------------- public helpers
    @property
    def tokenizer(self):
        """The text tokenizer (the processor's own for a multimodal processor)."""
        return self._tokenizer

    @property
    def is_multimodal(self) -> bool:
        return self._is_vlm

    @property
    def outcome_reward_weights(self) -> torch.Tensor:
        """(F,) weight of each reward function, in `reward_funcs` order: `args.reward_weights`, or all 1 (TRL's own
        tensor, which also covers a reward function TRL appends itself)."""
        return self.reward_weights

    @property
    def eos_ids(self) -> list[int]:
        """The ids that end a completion: the generation config's EOS ids and the tokenizer's (TRL's union)."""
        return list(self.eos_token_ids)

    @property
    def masks_truncated_completions(self) -> bool:
        """Whether completions not ended by an EOS (or pad) id are removed from the loss (TRL's
        `mask_truncated_completions`)."""
        return bool(self.mask_truncated_completions)

    def local_rows(self, num_local_rows: int) -> slice:
        """This process's rows within the gathered batch (every process holds `num_local_rows`, in rank order)."""
        start = self.accelerator.process_index * num_local_rows
        return slice(start, start + num_local_rows)

    @property
    def current_rollout(self) -> Rollout | None:
        """The rollout of the generation batch being scored (None outside `_generate_and_score_completions`)."""
        return self._current_rollout

    def run_in_background(self, function, *args) -> Future:
        """`function(*args)` on the trainer's one scoring worker thread; `result()` returns its value or re-raises
        its exception. Jobs run one at a time, in order; a job of a generation batch that is not collected by the
        end of that batch (its step failed) is cancelled or waited for there, so none outlives its batch."""
        if self._background_executor is None:
            self._background_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ppm-trl-scoring")
        future = self._background_executor.submit(function, *args)
        if self._background_futures is None:
            self._background_futures = []
        self._background_futures.append(future)
        return future

    def compute_rewards_early(self, rollout: Rollout) -> torch.Tensor:
        """(B_global, F) rewards of the final rows, computed now — before TRL's log-prob passes — instead of in TRL's
        reward pass, which then returns these very values (the reward functions run once per batch either way, and
        their logs are TRL's). Training only (from `on_final_rollout`), a collective; not with a `rollout_func`'s
        extra fields, which join the rows only just before TRL's rewards."""
        if rollout.extra_fields:
            raise ValueError("compute_rewards_early: this rollout has a rollout_func's extra fields "
                             f"({sorted(rollout.extra_fields)}), which the rows get only at TRL's reward pass")
        rewards = GRPOTrainer._calculate_rewards(self, rollout.rows, rollout.prompts, rollout.completions,
                                                 rollout.completion_ids)
        self._early_rewards = ([list(ids) for ids in rollout.completion_ids], rewards)  # a copy: the check needs it
        return rewards

    def log_metric(self, name: str, value: float) -> None:
        """Append `value` to metric `name` of the current mode (averaged by TRL at the next log)."""
        mode = "train" if self.model.training else "eval"
        self._metrics[mode][name].append(float(value))

    def sample_completion_ids(self, prompt_ids, images=None, multimodal_fields=None, num_generations=1,
                              has_tool_images=False):
        """The generation backend: completion ids and sampling log-probs (None with HF generate) per prompt."""
        return GRPOTrainer._generate_single_turn(self, prompt_ids, images, multimodal_fields or {}, num_generations,
                                                 has_tool_images)

    def generate_token_ids(self, prompt_ids: list[list[int]], max_tokens: list[int], dummy: list[int]):
        """Completions of text-only `prompt_ids` rows, at most `max_tokens[i]` tokens for row i: (ids, log-probs).

        Rows after the first len(max_tokens) are dummies (padding so that every rank makes the same calls; they get
        empty results with vLLM). A collective: every rank calls it with the same number of rows. HF generate: one
        call of max_completion_length tokens, rows cut to their budget. vLLM: no request asks for more than
        max_model_len − len(prompt) tokens (server mode answers HTTP 400 otherwise); the calls are planned on every
        rank's rows, so each call has the same max_tokens and row count on every rank.
        """
        if not self.use_vllm:
            ids, logprobs = self.sample_completion_ids(prompt_ids)
            cut = list(max_tokens) + [None] * (len(ids) - len(max_tokens))
            ids = [list(row)[:n] for row, n in zip(ids, cut)]
            return ids, None if logprobs is None else [list(row)[:n] for row, n in zip(logprobs, cut)]
        context = self.generation_context_length()
        rank = self.accelerator.process_index
        local = [(rank, i, budget, None if context is None else context - len(prompt_ids[i]))
                 for i, budget in enumerate(max_tokens)]
        everyone = gather_object(local) if self.accelerator.num_processes > 1 else local
        calls = plan_generation_calls([b for *_, b, _ in everyone], [r for *_, r in everyone])
        generated, sampled = [[] for _ in prompt_ids], [[] for _ in prompt_ids]
        generation = self.vllm_generation
        default_max_tokens = generation.max_completion_length
        try:
            for call_max_tokens, members in calls:
                mine = [everyone[j][1] for j in members if everyone[j][0] == rank]
                width = max(sum(everyone[j][0] == r for j in members) for r in range(self.accelerator.num_processes))
                call_rows = [prompt_ids[i] for i in mine] + [dummy] * (width - len(mine))
                generation.max_completion_length = call_max_tokens
                ids, logprobs = self.sample_completion_ids(call_rows)
                for position, i in enumerate(mine):
                    generated[i] = list(ids[position])[: max_tokens[i]]
                    sampled[i] = list(logprobs[position])[: max_tokens[i]]
        finally:
            generation.max_completion_length = default_max_tokens
        return generated, sampled

    def generation_context_length(self) -> int | None:
        """vLLM's max_model_len (prompt + completion tokens of one request), the same on every rank; None for HF."""
        if not self.use_vllm:
            return None
        if getattr(self, "_vllm_context", None) is None:
            if self.vllm_mode == "colocate":
                context = [self.vllm_generation.llm.llm_engine.model_config.max_model_len]
            else:  # only the main process talks to the server
                context = [self.args.vllm_max_model_length]
                if self.accelerator.is_main_process:
                    try:
                        context = [self.vllm_generation.vllm_client.get_server_info()["model_config"]["max_model_len"]]
                    except Exception as error:  # a server without dev endpoints: fall back to the configured value
                        logger.warning("cannot read the vLLM server's max_model_len (%s); using "
                                       "vllm_max_model_length=%s", error, self.args.vllm_max_model_length)
                if self.accelerator.num_processes > 1:
                    broadcast_object_list(context, from_process=0)
            self._vllm_context = context[0]
        return self._vllm_context

    def outcome_rewards(self, rows, prompts, completions, completion_ids) -> torch.Tensor:
        """(B_global, F) rewards of the reward functions alone (no method scores; a collective). TRL scores the
        final rows again and logs those, so this call's pending logs are dropped."""
        rewards = GRPOTrainer._calculate_rewards(self, rows, prompts, completions, completion_ids)
        self._pending_extra_logs.clear()
        self._pending_metrics.clear()
        return rewards

    def sequence_logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[torch.Tensor]:
        """Per-token log π(c_j | x, c_<j) of each (prompt, completion) row: one batched no-grad forward of the
        current model (temperature-scaled, like sampling); float64 on the CPU, one tensor per row."""
        pad_id, device = self.tokenizer.pad_token_id, self.accelerator.device
        prompts = [torch.tensor(list(p), dtype=torch.long) for p in prompt_ids]
        completions = [torch.tensor(list(c), dtype=torch.long) for c in completion_ids]
        input_ids = torch.cat([pad(prompts, padding_value=pad_id, padding_side="left"),
                               pad(completions, padding_value=pad_id, padding_side="right")], dim=1).to(device)
        attention_mask = torch.cat(
            [pad([torch.ones_like(p) for p in prompts], padding_value=0, padding_side="left"),
             pad([torch.ones_like(c) for c in completions], padding_value=0, padding_side="right")], dim=1,
        ).to(device)
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model, input_ids, attention_mask, max(len(c) for c in completions),
                batch_size=self.args.per_device_train_batch_size,
            )
        return [logps[i, : len(c)].detach().double().cpu() for i, c in enumerate(completion_ids)]

    def decode_completions(self, prompts, prompt_ids, completion_ids) -> list:
        """Completions decoded exactly as TRL's `_generate` decodes its own (conversational or plain text)."""
        if not completion_ids:
            return []
        if is_conversational({"prompt": prompts[0]}):
            if getattr(self.tokenizer, "response_template", None) is not None or getattr(
                self.tokenizer, "response_schema", None
            ) is not None:
                return [[parse_response(self.tokenizer, ids, prefix=list(p), tools=self.tools)]
                        for ids, p in zip(completion_ids, prompt_ids)]
            contents = self.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
            return [[{"role": "assistant", "content": content}] for content in contents]
        return self.processing_class.batch_decode(completion_ids, skip_special_tokens=True)

    # ------------------------------------------------------------------------- TRL hooks (each overridden once)
    _current_rollout = None
    _current_rows = None
    _background_executor = None
    _background_futures: list[Future] | None = None  # the jobs of the generation batch being scored
    _early_rewards = None  # (completion ids, gathered rewards) from `compute_rewards_early`, for TRL's reward pass
    _rewarded = None  # (rows, completions, completion ids, gathered rewards) of TRL's reward pass, for the ScoredBatch
    _pending = None  # what `on_final_rollout` returned for the batch being scored

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        return self.sample_completion_ids(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)

    def _generate(self, prompts):
        self._tokens_seen_before = self.state.num_input_tokens_seen
        output = super()._generate(prompts)
        names = [f.name for f in fields(Rollout) if f.name not in ("rows", "prompts")]  # TRL's tuple, in order
        rollout = Rollout(rows=self._current_rows, prompts=prompts, **dict(zip(names, output, strict=True)))
        rollout.completion_ids, rollout.completions = list(rollout.completion_ids), list(rollout.completions)
        if rollout.logprobs is not None:
            rollout.logprobs = list(rollout.logprobs)
        rollout = self.on_rollout(rollout)
        if type(self).on_rollout is not MethodTrainer.on_rollout:  # rows may have changed: TRL's stats describe them
            self._relog_completion_statistics(rollout)
        self._current_rollout = rollout
        if self.model.training:  # evaluation scores nothing: no early judge requests either
            self._pending = self.on_final_rollout(rollout)
        return tuple(getattr(rollout, name) for name in names)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        early, self._early_rewards = self._early_rewards, None
        if early is not None:
            early_ids, rewards_per_func = early
            if [list(ids) for ids in early_ids] != [list(ids) for ids in completion_ids_list]:
                raise RuntimeError("the completions rewarded early are not the ones TRL rewards (a bug)")
        else:
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self.model.training:
            self._rewarded = (inputs, completions, completion_ids_list, rewards_per_func)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        self._current_rows = inputs  # `_generate` only receives the prompts
        try:
            output = super()._generate_and_score_completions(inputs)
            if self.model.training:
                batch = self._scored_batch(output)
                advantages = self.compute_advantages(batch)
                if advantages is not None:
                    self._apply_advantages(output, advantages, batch.local)
            return output
        finally:
            self._current_rows = self._current_rollout = self._early_rewards = self._rewarded = self._pending = None
            # A job the batch did not collect (its step raised): drop it, and let none run into the next batch.
            for future in self._background_futures or ():
                future.cancel()
            wait(self._background_futures or ())
            self._background_futures = None

    # ---------------------------------------------------------------------- training, checkpoints, preemption
    _sigterm_received = False  # SIGTERM or Ctrl-C arrived: stop after this step (the name predates Ctrl-C)
    _stop_signal = signal.SIGTERM  # which of the two
    _saving = False

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        """TRL's `train`, resuming only from a complete checkpoint (`True`/`"last"`: the newest; see the module
        doc), training no step past `max_steps`, and stopping cleanly on SIGTERM (exit status 143) or Ctrl-C (130)."""
        checkpoint, message = resolve_resume_checkpoint(resume_from_checkpoint, self.args.output_dir)
        if message and self.accelerator.is_main_process:
            print(f"ppm_trl: {message}", file=sys.stderr, flush=True)
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
        with _loading_checkpoint_file(f"{resume_from_checkpoint} (its model weights)"):
            return super()._load_from_checkpoint(resume_from_checkpoint, *args, **kwargs)

    def _load_rng_state(self, checkpoint):
        if checkpoint is None:
            return super()._load_rng_state(checkpoint)
        # the file transformers reads: one per process when distributed
        name = f"rng_state_{self.args.process_index}.pth" if self.args.world_size > 1 else "rng_state.pth"
        with _loading_checkpoint_file(os.path.join(checkpoint, name)):
            return super()._load_rng_state(checkpoint)

    def _load_optimizer_and_scheduler(self, checkpoint):
        if checkpoint is None:
            return super()._load_optimizer_and_scheduler(checkpoint)
        for name in (OPTIMIZER_NAME, SCHEDULER_NAME, SCALER_NAME):  # which file is bad, before they are applied
            path = os.path.join(checkpoint, name)
            if os.path.isfile(path):
                with _loading_checkpoint_file(path):
                    if not isinstance(torch.load(path, map_location="cpu", weights_only=True, mmap=True), dict):
                        raise TypeError("not a state dict")
        with _loading_checkpoint_file(os.path.join(checkpoint, f"{OPTIMIZER_NAME} or {SCHEDULER_NAME}")):
            super()._load_optimizer_and_scheduler(checkpoint)
        states = {}
        for name in self.extra_checkpoint_state():
            path = os.path.join(checkpoint, name)
            if os.path.exists(path):
                with _loading_checkpoint_file(path), open(path, encoding="utf-8") as f:
                    states[name] = json.load(f)
        with _loading_checkpoint_file(", ".join(os.path.join(checkpoint, name) for name in states) or checkpoint):
            self.load_extra_checkpoint_state(states)

    # ---------------------------------------------------------------------------------------------------- the Hub
    def push_to_hub(self, *args, **kwargs):
        """Trainer's `push_to_hub`, leaving the run's private files out of the upload (`run_private_patterns`)."""
        with _uploads_ignoring(run_private_patterns(self.args)):
            return super().push_to_hub(*args, **kwargs)

    def _push_from_checkpoint(self, checkpoint_folder):
        with _uploads_ignoring(run_private_patterns(self.args)):  # it uploads output_dir too
            return super()._push_from_checkpoint(checkpoint_folder)

    # ------------------------------------------------------------------------------------------------ model card
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        """Transformers' `save_model`, then (for a final save, not a checkpoint's) the method's model card: name,
        paper, BibTeX, tags (the class attributes `_name`, `_paper`, `_tag_names`) and the base model. TRL writes
        its card only with checkpoints and on `push_to_hub`; PEFT's `save_pretrained` leaves its own boilerplate."""
        super().save_model(output_dir, _internal_call)
        if not _internal_call and self.is_world_process_zero():
            output_dir = output_dir or self.args.output_dir
            self.create_model_card(model_name=Path(output_dir).name)
            card = os.path.join(self.args.output_dir, "README.md")
            if os.path.abspath(output_dir) != os.path.abspath(self.args.output_dir):
                shutil.copyfile(card, os.path.join(output_dir, "README.md"))

    # What the card records beyond TRL's (`card_training_record`); `ppm-trl train` sets the first two from its flags.
    model_card_dataset: str | None = None  # None: described from the train dataset (a synthetic env names itself)
    model_card_license: str | None = None  # None: the base model's licence (its own card), else "unknown"

    def create_model_card(self, model_name=None, dataset_name=None, tags=None, license=None):
        """TRL's card, naming a local base model, with a real `license` and what the run was: dataset, reward
        functions, the method's settings and judge model (`card_training_record`; metadata key `ppm_trl`, and a
        section above TRL's framework versions). `push_to_hub` goes through here too. `license`: an SPDX id or Hub
        licence name; default `model_card_license`, else the licence the base model's own card declares
        (`base_model_license`), else `unknown` (TRL writes a placeholder, `licence: license`)."""
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        if not self.is_world_process_zero():
            return
        from huggingface_hub import ModelCard

        # TRL leaves a local base model out of the metadata (not a Hub id) and its template then prints
        # "fine-tuned version of [None]": name the local model instead.
        path = os.path.join(self.args.output_dir, "README.md")
        card = ModelCard.load(path)
        base = get_config_model_id(self.model.config)
        text = card.text
        if card.data.base_model is None and base:
            text = text.replace("[None](https://huggingface.co/None)", f"the local model `{base}`")
        if self.hub_model_id is None:  # a local save: the card's usage snippet loads the local directory
            text = text.replace('model="None"', f'model="{os.path.abspath(self.args.output_dir)}"')
        record = card_training_record(self, dataset_name)
        licence = license or self.model_card_license
        source = "set for this run" if licence else None
        inherited = None if licence else base_model_license(base)
        if inherited:
            licence, source = inherited["license"], f"the base model's card (`{base}`)"
            for key in ("license_name", "license_link"):
                if inherited.get(key):
                    card.data[key] = inherited[key]
        card.data.pop("licence", None)  # TRL's placeholder
        card.data.license = licence or "unknown"
        card.data["ppm_trl"] = record
        section = render_training_record(record, card.data.license, source)
        marker = "### Framework versions"
        text = text.replace(marker, section + marker, 1) if marker in text else text + "\n" + section
        card.text = text
        card.save(path)

    # ---------------------------------------------------------------------------------------------- the work
    def _scored_batch(self, output: dict) -> ScoredBatch:
        rows, completions, completion_ids, rewards_per_func = self._rewarded
        return ScoredBatch(
            rows=rows, completions=completions, completion_ids=completion_ids, rewards_per_func=rewards_per_func,
            outcome=weighted_outcome(rewards_per_func, self.outcome_reward_weights),
            completion_mask=output["completion_mask"], tool_mask=output.get("tool_mask"),
            local=self.local_rows(output["completion_ids"].shape[0]), pending=self._pending,
        )

    def _apply_advantages(self, output: dict, advantages: Advantages, local: slice) -> None:
        values = advantages.values[local]
        if advantages.segment_ids is not None:
            values = expand_segment_values(values.to(advantages.segment_ids.device), advantages.segment_ids)
        output["advantages"] = values.to(output["completion_ids"].device)
        if advantages.dropped is not None:
            dropped = advantages.dropped[local]
            if dropped.any():
                keep = (~dropped).to(output["completion_mask"].dtype).unsqueeze(1).to(output["completion_mask"].device)
                output["completion_mask"] = output["completion_mask"] * keep
            loss_mask = output["completion_mask"]
            if "tool_mask" in output:
                loss_mask = loss_mask * output["tool_mask"]
            output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        # TRL logged one float per gathered row: swap in ours (never a list).
        logged_values = (advantages.values if advantages.logged is None else advantages.logged).float().tolist()
        logged = self._logs["advantages"]
        for _ in range(min(len(logged_values), len(logged))):
            logged.pop()
        logged.extend(logged_values)

    def _relog_completion_statistics(self, rollout: Rollout) -> None:
        """Replace the token count and completion metrics TRL logged for the rows it generated by the final rows'."""
        mode = "train" if self.model.training else "eval"
        device = self.accelerator.device
        if rollout.tool_mask is not None:
            lengths = [sum(mask) for mask in rollout.tool_mask]
        else:
            lengths = [len(ids) for ids in rollout.completion_ids]
        lengths = self.accelerator.gather(torch.tensor(lengths, device=device))
        stops = {*self.eos_ids, self.tokenizer.pad_token_id}
        truncated = self.accelerator.gather(
            torch.tensor([not ids or ids[-1] not in stops for ids in rollout.completion_ids], device=device))
        metrics = self._metrics[mode]
        if mode == "train":
            prompt_tokens = self.accelerator.gather(torch.tensor([len(ids) for ids in rollout.prompt_ids],
                                                                 device=device)).sum().item()
            self.state.num_input_tokens_seen = self._tokens_seen_before + prompt_tokens + lengths.sum().item()
        metrics["num_tokens"] = [self.state.num_input_tokens_seen]
        for name, value in completion_statistics(lengths, truncated).items():
            metrics[name][-1] = value
