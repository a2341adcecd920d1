"""SFT warm start of the tiny model on a synthetic task's reference solutions (TRL `SFTTrainer`), cached on disk.

RL from a random byte-level model never sees a reward; the PPM paper starts from an instruction-tuned model. The
CPU stand-in is a tiny Qwen2 (`ppm_trl.tiny`) fine-tuned briefly on reference solutions over a mix of horizons,
deliberately undertrained so that per-sub-problem accuracy stays well below 1 and all-correct success falls off
a cliff as n grows — the regime where sparse and dense rewards differ. `evaluate_policy` measures both rates.

The checkpoint is cached in `~/.cache/ppm_trl/warmstart/<hash of the settings>` (or `PPM_TRL_CACHE`), a directory
loadable with `AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import re
import shutil
import sys
from dataclasses import asdict, dataclass, field

import torch

from ..evaluation import sample_completions
from ..quiet import datasets_progress_bars_off
from .kernels import (
    PINNED_KERNELS,
    cpu_model,
    cpu_supports_pinned_kernels,
    kernels_in_use,
    kernels_pinned,
    pinned_environ,
)

WARMSTART_VERSION = 3  # bump when the recipe changes, so old caches are not reused
# v2: a fixed number of SFT steps (no accuracy probe), one thread, deterministic algorithms, a stored fingerprint.
# v3: built under `kernels.PINNED_KERNELS` (the same weights on every x86-64 CPU), which are part of the key.


@dataclass
class WarmStartSettings:
    """Everything that determines the warm-start checkpoint (its cache key)."""

    env: str = field(default="multi_add", metadata={"help": "Synthetic env whose references are imitated."})
    horizons: tuple[int, ...] = field(default=tuple(range(1, 9)),
                                      metadata={"help": "Horizons n mixed uniformly in the SFT data (1..8: with "
                                                "1..16 the lookup of later sub-problems was not learned in 1,500 "
                                                "steps; 1..8 learns it in ~1,250)."})
    num_examples: int = field(default=48_000, metadata={"help": "SFT rows in total (spread over the horizons)."})
    max_steps: int = field(default=1000, metadata={
        "help": "SFT optimizer steps, always all of them: a stop that depends on a measured accuracy turns tiny "
                "numeric differences between machines into different checkpoints. Past the jump in which the "
                "lookups are learned (multi_add, lr 1e-3: seed 0 jumps between steps 500 and 600, seed 1 after 600); "
                "the errors that make the cliff come from `line_error_rate`, not from stopping early."})
    batch_size: int = field(default=32, metadata={"help": "SFT batch size."})
    learning_rate: float = field(default=1e-3, metadata={
        "help": "SFT learning rate (AdamW, constant after warmup). At 3e-3 the lookups were learned per (n, line) "
                "pair in jumps, leaving walls (lines at 0.0-0.1) at some horizons even after 2,000 steps."})
    line_error_rate: float | None = field(default=None, metadata={
        "help": "Probability that a line of an SFT reference states a wrong sum (off by one; the box repeats the "
                "sums as written). A warm start trained past the lookup jump on such data errs on each line at about "
                "this rate whatever its seed or machine (per-line accuracy ~0.55 at 0.4 and 1,000 steps, for seeds 0 "
                "and 1 alike), so all-correct falls off smoothly in n instead of depending on where training stopped. "
                "On multi_add_boxed the box states the true sums instead (a right answer after flawed work). "
                "None: 0.4 for multi_add and multi_add_boxed, 0 for other envs (multi_add envs only)."})
    hidden_size: int = field(default=128, metadata={"help": "Tiny Qwen2 width."})
    num_hidden_layers: int = field(default=2, metadata={"help": "Tiny Qwen2 depth."})
    num_attention_heads: int = field(default=4, metadata={"help": "Attention heads."})
    seed: int = field(default=0, metadata={"help": "Seed of the model init, the data and the SFT order."})

    def __post_init__(self):
        self.horizons = tuple(int(n) for n in self.horizons)
        if not self.horizons or min(self.horizons) < 1:
            raise ValueError(f"horizons must be a non-empty list of integers >= 1, got {self.horizons}")
        for name in ("num_examples", "max_steps", "batch_size", "hidden_size", "num_hidden_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.line_error_rate is None:
            self.line_error_rate = 0.4 if self.env in ("multi_add", "multi_add_boxed") else 0.0
        if not 0.0 <= self.line_error_rate < 1.0:
            raise ValueError(f"line_error_rate is a probability in [0, 1), got {self.line_error_rate}")
        if self.line_error_rate and self.env not in NOISY_ENVS:
            raise ValueError(f"line_error_rate applies to {', '.join(NOISY_ENVS)} references, not {self.env!r}")

    @classmethod
    def for_env(cls, env: str, **overrides) -> WarmStartSettings:
        """The settings tuned for `env` (`ENV_RECIPES`), with `overrides` on top."""
        return cls(env=env, **{**ENV_RECIPES.get(env, {}), **overrides})

    def key(self) -> str:
        payload = json.dumps({"version": WARMSTART_VERSION, "kernels": PINNED_KERNELS, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


# Per-env departures from the defaults. chain_add: at 1e-3 it learns in a sudden jump (per-sub-problem accuracy at
# n = 6 goes 0.03 → 0.95 over steps ~1,520-1,565); the recipe v1 probe stopped inside it at step 1,542, now a fixed
# step count (not re-measured with recipe v2). multi_add_any_order: which labels are still to write is harder to
# learn than a fixed order; at 1,000 steps n = 2 is solved a quarter of the time and n = 3 4 % (ARG's testbed).
# multi_add_boxed (the defaults: 1,000 steps, 40 % wrong work lines, true sums boxed): the box is right 0.92 / 0.86 /
# 0.72 of the time at n = 2 / 3 / 4 while each work line is right ~0.6 (PAPO's testbed: correct answers differ in
# process).
ENV_RECIPES: dict[str, dict] = {
    "chain_add": {"max_steps": 1542},
    "multi_add_any_order": {"max_steps": 1000},
}

# The weights digest (`weights_digest`) each recipe gave on the reference machine (2-core AMD EPYC VM with AVX-512,
# torch 2.13.0 CPU, the pins of constraints/tested.txt), under the pinned kernels (`kernels.PINNED_KERNELS`), which
# give the same digest on every x86-64 CPU measured (BENCHMARKS.md "Numbers across x86-64 CPUs"). A build that differs
# (another torch or MKL build, a CPU that is not x86-64) is kept but reported.
REFERENCE_DIGESTS: dict[str, str] = {
    "b7ce6d512aa86574": "4d023b9e4af2af9a",  # multi_add, seed 0 (the demo's and the benchmarks' warm start)
    "2abcafb129f9e184": "953268684f94961f",  # multi_add, seed 1 (`--sft-seed 1`: the second warm start)
    "73c50c6b67e62b7c": "0fabd5f63fe7e06f",  # multi_add_any_order, seed 0 (ARG's)
    "c61b34d12ac1845f": "1d9b97697658b015",  # multi_add_boxed, seed 0 (PAPO's: true sums boxed, 40 % wrong lines)
}


def default_cache_root() -> str:
    root = os.environ.get("PPM_TRL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "ppm_trl")
    return os.path.join(root, "warmstart")


@contextlib.contextmanager
def deterministic_cpu(threads: int = 1):
    """Pin torch to `threads` intra-op threads and deterministic algorithms for the block, then restore both.

    Float sums in another order give another checkpoint (and at this model size the difference is qualitative: a
    2-thread SFT once left two lines of n = 6 at ~0.1), so everything whose numbers are reported — the SFT, the
    horizon profile, the RL runs of the demo and the benchmarks — runs inside this, whatever OMP_NUM_THREADS says.
    """
    previous_threads = torch.get_num_threads()
    previous_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous_deterministic)
        torch.set_num_threads(previous_threads)


def weights_digest(path: str) -> str:
    """sha256 (first 16 hex digits) of a saved checkpoint's tensors, by name, as float32 little-endian bytes.

    The same numbers give the same digest whatever the order of the state dict or the file's metadata.
    """
    from safetensors.torch import load_file

    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {path}")
    state = {}
    for name in files:
        state.update(load_file(os.path.join(path, name)))
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].to(torch.float32).contiguous().numpy().astype("<f4").tobytes())
    return digest.hexdigest()[:16]


def sft_dataset(settings: WarmStartSettings):
    """Prompt-completion rows (`prompt` chat, `completion` the reference as the assistant turn) over the settings'
    horizons, shuffled."""
    from datasets import concatenate_datasets

    from ..envs import make_dataset

    per_horizon = math.ceil(settings.num_examples / len(settings.horizons))
    parts = [
        make_dataset(settings.env, n, per_horizon, seed=10_000 * settings.seed + 1_000 + n).select_columns(
            ["prompt", "reference"])
        for n in settings.horizons
    ]
    data = concatenate_datasets(parts).shuffle(seed=settings.seed)
    if settings.line_error_rate:
        rng = random.Random(settings.seed)
        true_box = settings.env == "multi_add_boxed"
        data = data.map(lambda row: {"reference": with_line_errors(row["reference"], settings.line_error_rate, rng,
                                                                   true_box=true_box)})
    return data.map(lambda row: {"completion": [{"role": "assistant", "content": row["reference"]}]},
                    remove_columns=["reference"])


NOISY_ENVS = ("multi_add", "multi_add_any_order", "multi_add_boxed")
_SUM_LINE = re.compile(r"^([a-z]):(\d+)\+(\d+)=(\d+)$")


def with_line_errors(reference: str, rate: float, rng: random.Random, true_box: bool = False) -> str:
    """A multi_add reference whose lines each state a wrong sum (±1, never negative) with probability `rate`; the
    final `\\boxed{a=..,b=..}` repeats the sums as written, so the text stays self-consistent — or, with `true_box`,
    states the true sums (`multi_add_boxed`: a right answer after flawed work). The rng draws are the same either
    way."""
    lines, written = reference.split("\n"), {}
    for i, line in enumerate(lines[:-1]):
        match = _SUM_LINE.match(line)
        if match is None:
            raise ValueError(f"not a multi_add reference line: {line!r}")
        label, a, b, total = match.group(1), match.group(2), match.group(3), int(match.group(4))
        if rng.random() < rate:
            total = total + 1 if total == 0 or rng.random() < 0.5 else total - 1
        lines[i], written[label] = f"{label}:{a}+{b}={total}", int(a) + int(b) if true_box else total
    lines[-1] = "\\boxed{" + ",".join(f"{label}={written[label]}" for label in sorted(written)) + "}"
    return "\n".join(lines)


def completion_only_tokens(tokenizer, prompt: list[dict], completion: list[dict]) -> dict[str, list[int]]:
    """`input_ids` of the chat-formatted prompt + completion and `labels` = -100 over the prompt: the loss of SFT
    on prompt-completion data (TRL's `completion_only_loss`), for a plain `transformers.Trainer`."""
    prompt_text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    full_text = tokenizer.apply_chat_template(prompt + completion, tokenize=False)
    if not full_text.startswith(prompt_text):
        raise ValueError("the chat template renders the prompt differently inside the conversation; cannot mask it")
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(full_text[len(prompt_text):], add_special_tokens=False)["input_ids"]
    return {"input_ids": prompt_ids + completion_ids, "labels": [-100] * len(prompt_ids) + completion_ids}


def read_manifest(path: str) -> dict:
    with open(os.path.join(path, "warmstart.json")) as handle:
        return json.load(handle)


def warm_start(settings: WarmStartSettings | None = None, cache_root: str | None = None, force: bool = False,
               progress: bool = True, verify: bool = True) -> str:
    """Path of the SFT'd checkpoint for `settings`, training it unless cached (default: ~12 min of one core).

    The checkpoint's `warmstart.json` stores the settings, the kernels it was built with and the weights digest. A
    cached checkpoint whose weights no longer match its stored digest (a partial copy, an edited file, a build of
    another code version under the same key) is rebuilt, saying why. `verify=False` skips that check (it reads the
    weights once). The build runs under `kernels.PINNED_KERNELS`: in this process when it already runs with them
    (the demo's and the benchmarks' entry points re-execute themselves so), else in a child process that does.
    """
    import filelock

    settings = settings or WarmStartSettings()
    cache_root = cache_root or default_cache_root()
    path = os.path.join(cache_root, settings.key())
    os.makedirs(cache_root, exist_ok=True)
    # Processes asking for one checkpoint at once (two launches, two test workers): one builds, the others wait and
    # read it — two builds would share one staging directory.
    with filelock.FileLock(path + ".lock"):
        if not force and _cached(path, verify):
            return path
        if kernels_pinned() or not cpu_supports_pinned_kernels():
            build_warm_start(settings, path, progress)
        else:
            _build_in_pinned_child(settings, path, progress)
    return path


def _cached(path: str, verify: bool) -> bool:
    """Whether `path` holds a finished build (and, with `verify`, its weights still match their stored digest)."""
    if not os.path.exists(os.path.join(path, "warmstart.json")):
        return False
    if not verify:
        return True
    stored = read_manifest(path).get("weights_digest")
    actual = weights_digest(path)
    if stored == actual:
        return True
    print(f"warm start: the cached checkpoint {path} has weights digest {actual}, but its warmstart.json "
          f"says {stored}; rebuilding it", flush=True)
    return False


def _build_in_pinned_child(settings: WarmStartSettings, path: str, progress: bool) -> None:
    import subprocess

    code = ("import json, sys; from ppm_trl.demo.warmstart import WarmStartSettings, build_warm_start\n"
            "try:\n    build_warm_start(WarmStartSettings(**json.loads(sys.argv[1])), sys.argv[2], sys.argv[3] == '1')\n"
            "except KeyboardInterrupt:\n    sys.exit(130)  # the parent says it, in one line")
    try:
        done = subprocess.run([sys.executable, "-c", code, json.dumps(asdict(settings)), path,
                               "1" if progress else "0"], env=pinned_environ())
    except KeyboardInterrupt:
        raise KeyboardInterrupt("the warm-start build was interrupted; nothing of it was cached") from None
    if done.returncode in (130, -2):
        raise KeyboardInterrupt("the warm-start build was interrupted; nothing of it was cached")
    if done.returncode != 0:
        raise RuntimeError(f"the warm-start build (a child process with the pinned kernels {PINNED_KERNELS}) exited "
                           f"with {done.returncode}; its output is above")


def build_warm_start(settings: WarmStartSettings, path: str, progress: bool = True) -> None:
    """Train `settings`' checkpoint into `path` (replacing it) with the kernels of this process: the body of
    `warm_start`, which calls it where the kernels are pinned."""
    from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments

    from ..tiny import build_tiny_model_and_tokenizer

    staging = path + ".tmp"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        with deterministic_cpu():
            model, tokenizer = build_tiny_model_and_tokenizer(
                seed=settings.seed, hidden_size=settings.hidden_size, num_hidden_layers=settings.num_hidden_layers,
                num_attention_heads=settings.num_attention_heads, num_key_value_heads=settings.num_attention_heads,
            )
            with datasets_progress_bars_off():  # three Map bars over data built here; the SFT bar shows the stage
                data = sft_dataset(settings)
                data = data.map(lambda row: completion_only_tokens(tokenizer, row["prompt"], row["completion"]),
                                remove_columns=data.column_names)
            # A plain Trainer with the model's own loss: TRL's SFTTrainer computes it through a chunked LM head whose CPU
            # fallback loops in Python (~5x slower per step here); the loss is the same completion-only NLL.
            args = TrainingArguments(
                output_dir=staging, max_steps=settings.max_steps, per_device_train_batch_size=settings.batch_size,
                learning_rate=settings.learning_rate, lr_scheduler_type="constant_with_warmup", warmup_steps=20,
                weight_decay=0.0, seed=settings.seed, data_seed=settings.seed, use_cpu=True, bf16=False,
                report_to="none", save_strategy="no", logging_steps=max(settings.max_steps // 10, 1),
                disable_tqdm=not progress, dataloader_num_workers=0,
            )
            padding_side, tokenizer.padding_side = tokenizer.padding_side, "right"  # positions start at 0 in training
            collator = DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100)
            trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=collator)
            try:
                trainer.train()
            finally:
                tokenizer.padding_side = padding_side
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        digest = weights_digest(staging)
        with open(os.path.join(staging, "warmstart.json"), "w") as handle:
            json.dump({"version": WARMSTART_VERSION, **asdict(settings), "key": settings.key(),
                       "steps_trained": trainer.state.global_step, "weights_digest": digest,
                       "torch": torch.__version__, "kernels": kernels_in_use(), "cpu": cpu_model()}, handle, indent=2)
    except BaseException:  # Ctrl-C or a failure: nothing half-built stays in the cache
        shutil.rmtree(staging, ignore_errors=True)
        raise
    shutil.rmtree(path, ignore_errors=True)
    os.replace(staging, path)


def reference_check(settings: WarmStartSettings, path: str) -> str | None:
    """A sentence when `path`'s weights differ from the reference machine's build of the same recipe, else None."""
    expected = REFERENCE_DIGESTS.get(settings.key())
    manifest = read_manifest(path)
    actual = manifest.get("weights_digest")
    if expected is None or expected == actual:
        return None
    return (f"this machine built warm-start weights {actual}, the reference build of this recipe is {expected} "
            f"(built with kernels {manifest.get('kernels')}, torch {manifest.get('torch')}; the reference: "
            f"{PINNED_KERNELS}, torch 2.13.0+cpu); the numbers printed will differ from BENCHMARKS.md's")


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
                    batch_size: int = 128, keep_completions: int = 0,
                    process_scores: dict | None = None, start_model=None) -> dict[str, float]:
    """Sampled success on `dataset` rows: `all_correct` (the env's verifier) and `per_subproblem` accuracy.

    `per_subproblem` is the mean fraction of points 1..n reached (goal excluded, no graph closure), the metric that
    still moves when all-correct success is 0; `per_point[k-1]` is the fraction of rows reaching point k (where in
    the solution errors sit), given when all rows have the same number of points. `completions` (with
    `keep_completions`): the first that many rows' completion, verdict and points reached, to read what was learned.
    `process_scores[name]`: `(row, text) -> float`, reported as the mean over the rows under `name`.
    `start_model`: the policy training started from; `kl_to_start` is then KL(π ‖ π_start) per token on these
    completions (`evaluation.mean_token_kl`).
    """
    from ..envs import get_env

    rows = dataset.to_list()
    samples = sample_completions(model, tokenizer, [row["prompt"] for row in rows], 1, max_new_tokens,
                                 temperature=temperature, batch_size=batch_size, seed=seed)
    completions = [texts[0] for texts in samples]
    verdicts, fractions, reached_sets = [], [], []
    for row, text in zip(rows, completions):
        env = get_env(row["env"])
        verdicts.append(bool(env.verify(row, text)))
        num_sub = len(row["reasoning_points"]) - 1
        reached = env.match_points(row, text) - {num_sub + 1}
        fractions.append(len(reached) / num_sub)
        reached_sets.append(reached)
    metrics = {"all_correct": sum(verdicts) / len(rows), "per_subproblem": sum(fractions) / len(rows), "num_prompts": len(rows)}
    for name, score in (process_scores or {}).items():
        metrics[name] = sum(score(row, text) for row, text in zip(rows, completions)) / len(rows)
    if start_model is not None:
        from ..evaluation import mean_token_kl

        metrics["kl_to_start"] = mean_token_kl(model, start_model, tokenizer, [row["prompt"] for row in rows],
                                               completions, batch_size=batch_size)
    sizes = {len(row["reasoning_points"]) - 1 for row in rows}
    if len(sizes) == 1:
        metrics["per_point"] = [sum(k in reached for reached in reached_sets) / len(rows) for k in range(1, sizes.pop() + 1)]
    if keep_completions:
        metrics["completions"] = [
            {"completion": text, "correct": correct, "points": sorted(reached)}
            for text, correct, reached in list(zip(completions, verdicts, reached_sets))[:keep_completions]]
    return metrics


def evaluate_pass_at_k(model, tokenizer, dataset, max_new_tokens: int, k: int, seed: int = 0,
                       batch_size: int = 128) -> dict[str, float]:
    """`pass@1`, `pass@k` (unbiased estimator over k samples per prompt, T = 1) and `avg@k` on `dataset` rows."""
    from ..envs import get_env
    from ..evaluation import sample_completions, summarize

    rows = dataset.to_list()
    samples = sample_completions(model, tokenizer, [row["prompt"] for row in rows], k, max_new_tokens,
                                 temperature=1.0, batch_size=batch_size, seed=seed)
    correct = [[get_env(row["env"]).verify(row, text) for text in texts] for row, texts in zip(rows, samples)]
    return summarize(correct, sorted({1, k}))


__all__ = ["ENV_RECIPES", "REFERENCE_DIGESTS", "WarmStartSettings", "build_warm_start", "completion_budget",
           "default_cache_root", "deterministic_cpu", "evaluate_pass_at_k", "evaluate_policy", "load_policy",
           "read_manifest", "reference_check", "sft_dataset", "warm_start", "weights_digest"]
