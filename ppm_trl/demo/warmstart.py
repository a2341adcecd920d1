"""SFT warm start of the tiny model on a synthetic task's reference solutions (TRL `SFTTrainer`), cached on disk.

RL from a random byte-level model never sees a reward; the PPM paper starts from an instruction-tuned model. The
CPU stand-in is a tiny Qwen2 (`ppm_trl.tiny`) fine-tuned briefly on reference solutions over a mix of horizons,
deliberately undertrained so that per-sub-problem accuracy stays well below 1 and all-correct success falls off
a cliff as n grows — the regime where sparse and dense rewards differ. `evaluate_policy` measures both rates.

The checkpoint is cached in `~/.cache/ppm_trl/warmstart/<hash of the settings>` (or `PPM_TRL_CACHE`), a directory
loadable with `AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from dataclasses import asdict, dataclass, field

import torch

from ..evaluation import sample_completions

WARMSTART_VERSION = 1  # bump when the recipe changes, so old caches are not reused


_ADDED_AFTER_V1 = ("fine_probe_from",)  # settings that enter the cache key only when set


@dataclass
class WarmStartSettings:
    """Everything that determines the warm-start checkpoint (its cache key)."""

    env: str = field(default="multi_add", metadata={"help": "Synthetic env whose references are imitated."})
    horizons: tuple[int, ...] = field(default=tuple(range(1, 9)),
                                      metadata={"help": "Horizons n mixed uniformly in the SFT data (1..8: with "
                                                "1..16 the lookup of later sub-problems was not learned in 1,500 "
                                                "steps; 1..8 learns it in ~1,250)."})
    num_examples: int = field(default=48_000, metadata={"help": "SFT rows in total (spread over the horizons)."})
    max_steps: int = field(default=3000, metadata={"help": "SFT optimizer steps at most (the probe usually stops "
                                                              "it earlier)."})
    batch_size: int = field(default=32, metadata={"help": "SFT batch size."})
    learning_rate: float = field(default=3e-3, metadata={"help": "SFT learning rate (AdamW, constant after warmup)."})
    target_per_subproblem: float | None = field(
        default=0.6,
        metadata={"help": "Stop SFT once sampled per-sub-problem accuracy at `probe_horizon` reaches this (None: "
                  "train max_steps). Keeps the warm start imperfect, so that success falls off a cliff in n."},
    )
    probe_horizon: int = field(default=6, metadata={"help": "Horizon of the early-stopping probe."})
    probe_size: int = field(default=64, metadata={"help": "Prompts in the early-stopping probe."})
    probe_every: int = field(default=50, metadata={"help": "SFT steps between probes."})
    fine_probe_from: float | None = field(
        default=None,
        metadata={"help": "Probe after every step once the probe's per-sub-problem accuracy reaches this (None: "
                  "never). For tasks learned in a sudden jump (chain_add goes from 0.03 to 0.95 in ~40 steps), "
                  "so that the stop lands inside it."},
    )
    hidden_size: int = field(default=128, metadata={"help": "Tiny Qwen2 width."})
    num_hidden_layers: int = field(default=2, metadata={"help": "Tiny Qwen2 depth."})
    num_attention_heads: int = field(default=4, metadata={"help": "Attention heads."})
    seed: int = field(default=0, metadata={"help": "Seed of the model init, the data and the SFT order."})

    def __post_init__(self):
        self.horizons = tuple(int(n) for n in self.horizons)
        if not self.horizons or min(self.horizons) < 1:
            raise ValueError(f"horizons must be a non-empty list of integers >= 1, got {self.horizons}")
        for name in ("target_per_subproblem", "fine_probe_from"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= 1:
                raise ValueError(f"{name} is an accuracy in [0, 1] (or None), got {value}")
        for name in ("num_examples", "max_steps", "batch_size", "hidden_size", "num_hidden_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @classmethod
    def for_env(cls, env: str, **overrides) -> WarmStartSettings:
        """The settings tuned for `env` (`ENV_RECIPES`), with `overrides` on top."""
        return cls(env=env, **{**ENV_RECIPES.get(env, {}), **overrides})

    def key(self) -> str:
        fields = {name: value for name, value in asdict(self).items()
                  if not (name in _ADDED_AFTER_V1 and value is None)}  # so that older caches keep their key
        payload = json.dumps({"version": WARMSTART_VERSION, **fields}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


# Per-env departures from the defaults. chain_add: at lr 3e-3 its SFT collapsed to one constant answer; at 1e-3
# it learns in a sudden jump (per-sub-problem accuracy at n = 6 goes 0.03 → 0.95 over steps ~1,520-1,565), so the
# probe switches to every step near it and stops early in it (0.2 at n = 6, step 1,542): per-line accuracy ~0.6,
# all-correct 0.29 / 0.07 / 0.035 / 0.012 at n = 2 / 4 / 6 / 8 — a cliff inside the trained horizons.
ENV_RECIPES: dict[str, dict] = {
    "chain_add": {"learning_rate": 1e-3, "probe_every": 10, "probe_size": 32, "target_per_subproblem": 0.2,
                  "fine_probe_from": 0.08},
}


def default_cache_root() -> str:
    root = os.environ.get("PPM_TRL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "ppm_trl")
    return os.path.join(root, "warmstart")


def sft_dataset(settings: WarmStartSettings):
    """Prompt-completion rows (TRL's format: loss on the completion only) over the settings' horizons."""
    from datasets import concatenate_datasets

    from ..envs import make_dataset

    per_horizon = math.ceil(settings.num_examples / len(settings.horizons))
    parts = [
        make_dataset(settings.env, n, per_horizon, seed=10_000 * settings.seed + 1_000 + n).select_columns(
            ["prompt", "reference"])
        for n in settings.horizons
    ]
    data = concatenate_datasets(parts).shuffle(seed=settings.seed)
    return data.map(lambda row: {"completion": [{"role": "assistant", "content": row["reference"]}]},
                    remove_columns=["reference"])


def warm_start(settings: WarmStartSettings | None = None, cache_root: str | None = None, force: bool = False,
               progress: bool = True) -> str:
    """Path of the SFT'd checkpoint for `settings`, training it unless cached (default: ~8 min, one thread)."""
    settings = settings or WarmStartSettings()
    path = os.path.join(cache_root or default_cache_root(), settings.key())
    if not force and os.path.exists(os.path.join(path, "warmstart.json")):
        return path
    from trl import SFTConfig, SFTTrainer

    from ..tiny import build_tiny_model_and_tokenizer

    model, tokenizer = build_tiny_model_and_tokenizer(
        seed=settings.seed, hidden_size=settings.hidden_size, num_hidden_layers=settings.num_hidden_layers,
        num_attention_heads=settings.num_attention_heads, num_key_value_heads=settings.num_attention_heads,
    )
    staging = path + ".tmp"
    shutil.rmtree(staging, ignore_errors=True)
    args = SFTConfig(
        output_dir=staging, max_steps=settings.max_steps, per_device_train_batch_size=settings.batch_size,
        learning_rate=settings.learning_rate, lr_scheduler_type="constant_with_warmup", warmup_steps=20,
        weight_decay=0.0,
        seed=settings.seed, use_cpu=True, bf16=False, gradient_checkpointing=False, report_to="none",
        save_strategy="no", logging_steps=max(settings.max_steps // 10, 1), disable_tqdm=not progress,
        dataloader_num_workers=0, max_length=None,
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=sft_dataset(settings), processing_class=tokenizer)
    probes: list[dict] = []
    if settings.target_per_subproblem is not None:
        trainer.add_callback(_accuracy_probe(settings, tokenizer, probes))
    # One thread: float sums in another order give a different checkpoint, and at this size the difference is
    # qualitative (a 2-thread run of the same settings left lines 3 and 5 of n = 6 at ~0.1, while the 1-thread one
    # used in BENCHMARKS.md falls off gradually), so the cache key must mean one model.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer.train()
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    with open(os.path.join(staging, "warmstart.json"), "w") as handle:
        json.dump({"version": WARMSTART_VERSION, **asdict(settings), "steps_trained": trainer.state.global_step,
                   "probes": probes}, handle, indent=2)
    shutil.rmtree(path, ignore_errors=True)
    os.replace(staging, path)
    return path


def _accuracy_probe(settings: WarmStartSettings, tokenizer, probes: list):
    """A callback that stops SFT once sampled per-sub-problem accuracy at `probe_horizon` reaches the target."""
    from transformers import TrainerCallback

    from ..envs import make_dataset

    probe = make_dataset(settings.env, settings.probe_horizon, settings.probe_size, seed=77_777)
    budget = completion_budget(settings.env, settings.probe_horizon)

    class AccuracyProbe(TrainerCallback):
        fine = False  # probing after every step (the accuracy has reached `fine_probe_from`)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % settings.probe_every and not self.fine:
                return
            metrics = evaluate_policy(model, tokenizer, probe, budget, seed=state.global_step)
            probes.append({"step": state.global_step, **metrics})
            print(f"  SFT step {state.global_step}: n={settings.probe_horizon} per-sub-problem "
                  f"{metrics['per_subproblem']:.3f}, all-correct {metrics['all_correct']:.3f}", flush=True)
            if metrics["per_subproblem"] >= settings.target_per_subproblem:
                control.should_training_stop = True
            if settings.fine_probe_from is not None and metrics["per_subproblem"] >= settings.fine_probe_from:
                self.fine = True

    return AccuracyProbe()


def load_policy(path: str):
    """(model, tokenizer) from a warm-start (or any saved) directory, on CPU, in train-ready fp32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer


def completion_budget(env: str, n: int, slack: float = 1.3) -> int:
    """Completion tokens to allow at horizon n: `slack` × the longest reference of 64 sampled rows (bytes = tokens)."""
    from ..envs import make_dataset

    longest = max(len(ref.encode()) for ref in make_dataset(env, n, 64, seed=123)["reference"])
    return int(math.ceil(slack * longest)) + 2


def evaluate_policy(model, tokenizer, dataset, max_new_tokens: int, temperature: float = 1.0, seed: int = 0,
                    batch_size: int = 128) -> dict[str, float]:
    """Sampled success on `dataset` rows: `all_correct` (the env's verifier) and `per_subproblem` accuracy.

    `per_subproblem` is the mean fraction of points 1..n reached (goal excluded, no graph closure), the metric that
    still moves when all-correct success is 0; `per_point[k-1]` is the fraction of rows reaching point k (where in
    the solution errors sit), given when all rows have the same number of points.
    """
    from ..envs import get_env

    rows = dataset.to_list()
    samples = sample_completions(model, tokenizer, [row["prompt"] for row in rows], 1, max_new_tokens,
                                 temperature=temperature, batch_size=batch_size, seed=seed)
    completions = [texts[0] for texts in samples]
    solved, fractions, reached_sets = 0, [], []
    for row, text in zip(rows, completions):
        env = get_env(row["env"])
        solved += env.verify(row, text)
        num_sub = len(row["reasoning_points"]) - 1
        reached = env.match_points(row, text) - {num_sub + 1}
        fractions.append(len(reached) / num_sub)
        reached_sets.append(reached)
    metrics = {"all_correct": solved / len(rows), "per_subproblem": sum(fractions) / len(rows), "num_prompts": len(rows)}
    sizes = {len(row["reasoning_points"]) - 1 for row in rows}
    if len(sizes) == 1:
        metrics["per_point"] = [sum(k in reached for reached in reached_sets) / len(rows) for k in range(1, sizes.pop() + 1)]
    return metrics


__all__ = ["ENV_RECIPES", "WarmStartSettings", "completion_budget", "default_cache_root", "evaluate_policy", "load_policy",
           "sft_dataset", "warm_start"]
