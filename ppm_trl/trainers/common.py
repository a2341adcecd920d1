"""Small pieces the trainers share: dataset checks, model resolution, the outcome reward, judge stats.

Nothing here touches TRL's private members (that is the seam's job alone, `trainers/base/`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import torch


def check_dataset_columns(dataset, required: dict[str, str], method: str) -> None:
    """Raise a ValueError naming the first missing/malformed column and row (`columns.check_required_columns`, the
    one column check, in Python spelling).

    `required` maps a column name to the kind of value it must hold: "str" (non-empty string), "list" (non-empty
    list of non-empty strings) or "any". Iterable datasets are checked lazily (only their column names).
    """
    from ..columns import check_required_columns

    check_required_columns(dataset, dict.fromkeys(required, method), spelling="python", kinds=required)


def check_method_columns(dataset, method: str, args, custom_scorer: bool = False) -> None:
    """The columns the registered `method` reads with this config (`ppm_trl.methods`) must be in the dataset, with
    cells of the right kind; `custom_scorer`: the trainer got its own scorer, the config's is not used."""
    from ..registry import get_method

    for column, need in get_method(method).required_columns(args, custom_scorer).items():
        check_dataset_columns(dataset, {column: need.kind}, need.reader)


def refuse_environment_owned_data(train_dataset, method: str, args, scorer_argument: str | None) -> None:
    """Called after GRPOTrainer's own checks, with the `train_dataset` the trainer was given: None there means the
    environment owns the data (TRL builds rows with a `prompt` only), so a column the method reads is in no row — a
    ValueError naming the column. `scorer_argument` (e.g. `progress_scorer`): the config's built-in scorer reads that
    column, and the trainer's own `scorer_argument=` (which reads no column) is the way out; None: nothing stands in
    for the column (VeriFree's reference answer, OPSD's teacher context), only a `train_dataset` that has it. A trainer
    given its own scorer does not call this."""
    from ..registry import get_method

    if train_dataset is not None:
        return
    for column, need in get_method(method).required_columns(args).items():
        if scorer_argument is None:
            raise ValueError(
                f"{method.upper()}: the environment owns the data (no `train_dataset`), so its rows have no "
                f"`{column}` column, which {need.reader} reads and nothing else can stand in for. Pass a "
                f"`train_dataset` with `{column}`"
            )
        name = getattr(args, scorer_argument)
        scorer = f"the `{name}` {scorer_argument.split('_')[0]} scorer (`{scorer_argument}={name!r}`)"
        raise ValueError(
            f"{method.upper()}: the environment owns the data (no `train_dataset`), so its rows have no `{column}` "
            f"column, which {scorer} reads. Pass your own scorer, which reads the completions and no column "
            f"(`{scorer_argument}=`, a callable `(rows, texts) -> scores`), or a `train_dataset` with `{column}`"
        )


def check_reward_columns(dataset, reward_funcs, method: str) -> None:
    """The columns the given reward functions read (the reward registry says which) must be in the dataset
    (checked before any generation); a user's own reward function is not checked."""
    from ..registry import reward_of_function

    for func in reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]:
        reward = reward_of_function(func) if callable(func) else None
        for column in reward.columns if reward is not None else ():
            check_dataset_columns(dataset, {column: "any"}, f"{method} with the `{func.__name__}` reward")


# The variables `accelerate launch` sets that would make the tiny model's builder join the run's process group.
_NO_LAUNCHER = {"ACCELERATE_USE_DEEPSPEED": "false", "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "1"}


def resolve_model_path(model, args, hidden_size: int = 64, num_hidden_layers: int = 2, tool_calling: bool = False):
    """`"tiny"` → the offline tiny model, saved under `args.output_dir`; a local directory → its absolute path.

    Absolute, so a LoRA adapter's `base_model_name_or_path` and the model card still point at it from elsewhere.
    """
    if model == "tiny":
        path = os.path.abspath(os.path.join(args.output_dir, "initial_tiny_model" + "_tools" * tool_calling))
        # Under `accelerate launch` every rank gets here. An OS file lock (not the launcher's barrier, which a
        # DeepSpeed launch with `use_cpu` did not give) lets the first process of a machine build while the others
        # wait and then find it; the lock lives in the temp dir, keyed by the path, never in output_dir.
        import hashlib
        import tempfile

        import filelock

        key = hashlib.sha256(path.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        complete = ("config.json", "model.safetensors", "tokenizer.json")
        with filelock.FileLock(os.path.join(tempfile.gettempdir(), f"ppm_trl_tiny_model_{key}.lock")):
            if os.path.isdir(path) and not all(os.path.exists(os.path.join(path, name)) for name in complete):
                # A directory this function did not finish (an older version wrote in place): rebuilt, not trusted.
                print(f"ppm_trl: {path} is incomplete (a build that was interrupted); building it again",
                      file=sys.stderr, flush=True)
                shutil.rmtree(path)
            if not os.path.exists(os.path.join(path, "config.json")):
                # Written beside, then renamed: a run stopped while saving leaves no model without its tokenizer,
                # and of two machines saving on a shared file system the first one's copy is kept.
                staging = os.path.join(args.output_dir, f".{os.path.basename(path)}.{uuid.uuid4().hex}")
                try:
                    # Under a launcher in a fresh interpreter: with ZeRO-3 this process builds every model inside
                    # DeepSpeed's zero.Init (partitioned, empty weights), and with a process group up
                    # `save_pretrained` writes the weights from rank 0 only — a rank 1 build had no weights file.
                    settings = dict(seed=args.seed, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
                                    tool_calling=tool_calling)
                    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or \
                            os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
                        subprocess.run([sys.executable, "-c", "import json, sys; from ppm_trl.tiny import "
                                        "save_tiny_model; save_tiny_model(sys.argv[1], **json.loads(sys.argv[2]))",
                                        staging, json.dumps(settings)], check=True, env={**os.environ, **_NO_LAUNCHER})
                    else:
                        from ..tiny import save_tiny_model

                        save_tiny_model(staging, **settings)
                    os.rename(staging, path)
                except OSError:
                    if not os.path.exists(os.path.join(path, "config.json")):
                        raise
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
        return path
    if isinstance(model, str) and os.path.isdir(os.path.expanduser(model)):
        return os.path.abspath(os.path.expanduser(model))
    return model


def registered_model_card(cls: type) -> dict:
    """{attribute: value} of TRL's card attributes that the registry decides for trainer class `cls`: those of
    its nearest registered class, except an attribute a subclass below that class sets itself."""
    from ..registry import method_of_trainer

    method = method_of_trainer(cls)
    if method is None:
        return {}
    below = cls.__mro__[: [f"{k.__module__}:{k.__qualname__}" for k in cls.__mro__].index(method.trainer)]
    return {attribute: value for attribute, value in method.model_card().items()
            if not any(attribute in vars(k) for k in below)}


def weighted_outcome(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor) -> torch.Tensor:
    """The scalar outcome reward TRL would use (`sum_then_normalize`): Σ_f w_f·r_f, NaN when every function is NaN."""
    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    outcome = (rewards_per_func * reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    outcome[unscorable] = torch.nan
    return outcome


def install_judge_stats(trainer, scorer) -> None:
    """Log judge/* metrics (calls, cache hits, failures, retries, latency, cost) when a scorer calls a judge."""
    from ..scorers import scorer_judge

    judge = scorer_judge(scorer)
    if judge is not None:
        from ..judge import JudgeStatsCallback
        from ..judge.budget import JudgeBudgetCallback

        JudgeStatsCallback(judge).install(trainer, scorer)  # with the scorer: its rows can be quarantined
        budgeted = getattr(judge, "max_cost_usd", None) is not None or getattr(judge, "max_total_tokens", None) is not None
        installed = any(isinstance(c, JudgeBudgetCallback) and c.judge is judge for c in trainer.callback_handler.callbacks)
        if budgeted and not installed:  # a composed trainer installs once
            trainer.add_callback(JudgeBudgetCallback(judge))
