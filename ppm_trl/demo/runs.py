"""The RL runs of the demo and the benchmarks: one `RunSpec` → one trainer from the warm start, with success tracked.

`train_variant` is the one training routine that `make demo` (`ppm_trl.demo.pipeline`) and the benchmarks
(`benchmarks/horizon_scaling.py`) share: every variant gets the same optimiser, samples and seed, and the same
held-out evaluation (`warmstart.evaluate_policy`, sampled at T = 1 with a fixed seed).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from .kernels import cpu_model, kernels_in_use
from .warmstart import completion_budget, deterministic_cpu, evaluate_pass_at_k, evaluate_policy, load_policy

KEPT_COMPLETIONS = 16  # completions of the last evaluation kept in a run's history (T = 1 and greedy)


@dataclass(frozen=True)
class Variant:
    """One arm of the demo and the benchmarks: its label in tables and plots, the registered method that trains it,
    and its config's settings beyond `_common_args` (a function of the run's `RunSpec`)."""

    label: str
    method: str
    settings: Callable[[RunSpec], dict] = lambda spec: {}


def _ppm(spec: RunSpec, **settings) -> dict:
    # PPM as the demo runs it: one segment per sub-problem, the outcome added to every segment, no std division.
    return {"granularity": "segment", "num_segments": spec.num_segments or spec.n, "add_outcome_reward": True,
            "scale_rewards": "none", "filter_zero_advantage_groups": True, **settings}


def _lines(spec: RunSpec, extra_segments: int = 0) -> dict:
    # a segment ends at each newline (line k = sub-problem k)
    return _ppm(spec, num_segments=(spec.num_segments or spec.n) + extra_segments, segmentation="delimiter",
                segment_delimiter="\n")


_GRPO = {"scale_rewards": "group"}
# The one variant table. ARG's arms run with `_common_args`' optimiser, not ARG's paper schedule (warmup 10, weight
# decay 0.01): the same optimiser for every variant.
VARIANT_TABLE: dict[str, Variant] = {
    "sparse": Variant("GRPO (sparse outcome)", "grpo", lambda spec: _GRPO),
    "trajectory": Variant("PPM trajectory-level", "ppm", lambda spec: _ppm(spec, granularity="trajectory")),
    "segment": Variant("PPM segment-level (equal chunks)", "ppm", _ppm),
    # the box joins the last line's segment
    "lines": Variant("PPM segment-level (one per line)", "ppm", _lines),
    # the programmatic process score: the fraction of reference lines a correct response states (no LLM judge)
    "papo": Variant("PAPO (programmatic process score)", "papo", lambda spec: {"process_scorer": "programmatic"}),
    # PAPO §6's multiplicative ablation: outcome × process in one reward, normalised over the whole group
    "papo_mult": Variant("PAPO multiplicative (ablation)", "papo",
                         lambda spec: {"process_scorer": "programmatic", "combine": "multiplicative"}),
    # PAPO §6's Fullnorm: incorrect rows enter the process normalisation with r_proc = 0
    "papo_fullnorm": Variant("PAPO Fullnorm (ablation)", "papo",
                             lambda spec: {"process_scorer": "programmatic", "process_norm": "full"}),
    # PAPO §3.2's reward-hacking arm: the process score alone (here a gameable one, `shown_work_reward`)
    "prm_only": Variant("PRM only (gameable process score)", "grpo", lambda spec: _GRPO),
    "arg": Variant("ARG (reference guidance)", "arg"),
    # one level α = ½, no selector: the fixed-guidance baseline
    "fixed_prefix": Variant("ARG fixed prefix (α = ½)", "arg", lambda spec: {"arg_levels": [0.5]}),
    "fixed_quarter": Variant("ARG fixed prefix (α = ¼)", "arg", lambda spec: {"arg_levels": [0.25]}),
    # one level α = 1 (the empty prefix); a group it does not rescue still falls back to the reference
    "resampling": Variant("resampling + reference fallback (α = 1 level)", "arg", lambda spec: {"arg_levels": [1.0]}),
    "reference_insertion": Variant("reference insertion", "arg",  # §5.3's ablation
                                   lambda spec: {"arg_mode": "reference_insertion"}),
    # ARG decides the rows of all-failure groups, segment-level PPM (as in "segment") credits every row
    "ppm+arg": Variant("PPM segment-level + ARG", "ppm+arg", _ppm),
    "papo+arg": Variant("PAPO + ARG", "papo+arg", lambda spec: {"process_scorer": "programmatic"}),
    # the PAPO arms with `ShownWorkProcessScorer` as r_proc (passed to the trainer in `build_variant_trainer`)
    "papo_gameable": Variant("PAPO (gameable process score)", "papo"),
    "papo_mult_gameable": Variant("PAPO multiplicative (gameable process score)", "papo",
                                  lambda spec: {"combine": "multiplicative"}),
    "papo_fullnorm_gameable": Variant("PAPO Fullnorm (gameable process score)", "papo",
                                      lambda spec: {"process_norm": "full"}),
    # PRM-only on the true process score: the fraction of the row's points stated (`env_point_fraction`)
    "prm_only_lines": Variant("PRM only (fraction of right lines)", "grpo", lambda spec: _GRPO),
    # ARG App. G.2's resampling baseline: K continuations from the empty prefix, an unrescued group unchanged
    "paper_resampling": Variant("resampling (ARG App. G.2: no fallback)", "arg",
                                lambda spec: {"arg_mode": "resampling"}),
    # n + 1 segments: the answer line is a segment of its own, so a right last line does not credit the answer's
    # tokens (issue 40 item 2: the answer format lost at n = 8)
    "lines_answer": Variant("PPM segment-level (one per line, the answer its own)", "ppm",
                            lambda spec: _lines(spec, extra_segments=1)),
    # the PPM paper's VeriFree baseline (App. B.1): the outcome + the likelihood of the reference's answer line
    "verifree": Variant("VeriFree (the PPM paper's baseline)", "verifree", lambda spec: _GRPO),
    # the PPM paper's OPSD baseline (App. B.1): the JSD to the warm start given the reference, no reward in the loss
    "opsd": Variant("OPSD (the PPM paper's baseline)", "opsd"),
}
VARIANTS = tuple(VARIANT_TABLE)
VARIANT_LABELS = {name: variant.label for name, variant in VARIANT_TABLE.items()}
# PAPO arms whose process score is the gameable `shown_work_reward` instead of the fraction of right lines
GAMEABLE_PAPO = ("papo_gameable", "papo_mult_gameable", "papo_fullnorm_gameable")



@dataclass
class RunSpec:
    """One RL run from the warm start: which estimator, which horizon, how many samples."""

    variant: str = field(default="segment", metadata={"help": f"One of {VARIANTS}."})
    n: int = field(default=8, metadata={"help": "Task horizon (number of sub-problems)."})
    learning_rate: float = field(default=1e-4, metadata={"help": "Adam learning rate (constant)."})
    max_steps: int = field(default=60, metadata={"help": "Optimizer steps; samples = steps·prompts·G."})
    prompts_per_step: int = field(default=8, metadata={"help": "Distinct prompts per step."})
    num_generations: int = field(default=8, metadata={"help": "G, samples per prompt."})
    num_segments: int | None = field(default=None, metadata={"help": "PPM K; default n (one segment per "
                                                                      "sub-problem: equal chunks, or lines)."})
    eval_every: int = field(default=10, metadata={"help": "Evaluate every this many steps."})
    seed: int = field(default=0, metadata={"help": "Seed of the RL run (sampling, data order)."})
    pass_k: int = field(default=0, metadata={"help": "At the last evaluation also sample this many completions per "
                                                     "prompt at T = 1: pass@1, pass@k and avg@k (0: off)."})
    harder_horizons: tuple[int, ...] = field(default=(), metadata={
        "help": "At the last evaluation also evaluate on held-out problems at these horizons (the sets are "
                "`train_variant`'s `harder_eval_sets`): does what was learned at n carry to harder problems?"})

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.n < 1 or self.max_steps < 1 or self.eval_every < 1 or self.pass_k < 0:
            raise ValueError(f"n, max_steps and eval_every must be >= 1 and pass_k >= 0, got {self.n}, "
                             f"{self.max_steps}, {self.eval_every}, {self.pass_k}")
        self.harder_horizons = tuple(int(m) for m in self.harder_horizons)
        if any(m < 1 for m in self.harder_horizons):
            raise ValueError(f"harder_horizons must be >= 1, got {self.harder_horizons}")

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.num_generations


def _common_args(spec: RunSpec, output_dir: str, budget: int, progress: bool) -> dict:
    # Identical for every variant: one on-policy update per batch, temperature 1, constant lr, fp32 on CPU.
    return dict(
        output_dir=output_dir, learning_rate=spec.learning_rate, max_steps=spec.max_steps,
        per_device_train_batch_size=spec.samples_per_step, num_generations=spec.num_generations,
        steps_per_generation=1, num_iterations=1, max_completion_length=budget, temperature=1.0,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, beta=0.0,
        epsilon_high=0.28, loss_type="dapo", mask_truncated_completions=True, seed=spec.seed,
        use_cpu=True, bf16=False, gradient_checkpointing=False, report_to="none", save_strategy="no",
        logging_steps=spec.eval_every, disable_tqdm=not progress, dataloader_num_workers=0,
    )


def variant_settings(spec: RunSpec) -> tuple[str, dict]:
    """(registered method, its config's settings beyond `_common_args`) of `spec.variant`."""
    variant = VARIANT_TABLE[spec.variant]
    return variant.method, dict(variant.settings(spec))


def shown_work_reward(completions: list, **kwargs) -> list[float]:
    """A deliberately gameable process score (the `prm_only` arm): work lines shown, sums and answer unchecked.

    min(1, well-formed `x:a+b=s` lines / (n + 1)). A correct answer scores n/(n + 1); one more work line, whatever
    it says, scores 1 — and breaks the strict outcome (exactly n lines, then the box). The stand-in for a process
    reward that pays for the look of reasoning (PAPO §3.2: under a process reward alone, length rises and accuracy
    falls)."""
    from ..text import completion_text

    return [shown_work(completion_text(completion), int(n))
            for completion, n in zip(completions, kwargs["n"], strict=True)]


def shown_work(text: str, n: int) -> float:
    """min(1, well-formed `x:a+b=s` lines of `text` / (n + 1)): `shown_work_reward` of one response."""
    from ..envs.multi_add import _parse_line

    return min(1.0, sum(_parse_line(line) is not None for line in text.split("\n")) / (n + 1))


class ShownWorkProcessScorer:
    """`shown_work_reward` as PAPO's process scorer (`(rows, texts) -> scores`) for the `*_gameable` arms: the
    comparison with PRM-only on one process score (issue 40 item 3)."""

    def __call__(self, rows, texts) -> list[float]:
        return [shown_work(text, int(row["n"])) for row, text in zip(rows, texts, strict=True)]


def build_variant_trainer(spec: RunSpec, model, tokenizer, train_dataset, output_dir: str, budget: int,
                  progress: bool = False):
    """The trainer of `spec.variant` (the method registry's classes); all share `_common_args` and the outcome
    reward (the env's verifier) — but the PRM-only arms, whose only reward is their process score."""
    from ..registry import get_method
    from ..rewards import env_outcome_reward, env_point_fraction

    name, settings = variant_settings(spec)
    method = get_method(name)
    args = method.config_class()(**_common_args(spec, output_dir, budget, progress), **settings)
    reward = {"prm_only": shown_work_reward, "prm_only_lines": env_point_fraction}.get(spec.variant,
                                                                                       env_outcome_reward)
    extra = {"process_scorer": ShownWorkProcessScorer()} if spec.variant in GAMEABLE_PAPO else {}
    return method.trainer_class()(args=args, model=model, reward_funcs=[reward], train_dataset=train_dataset,
                                  processing_class=tokenizer, **extra)


# Process scores recorded at every evaluation (mean over the prompts at T = 1), by env: on `multi_add_boxed` the
# gameable score, to see whether an arm that does not train on it inflates it anyway (issue 40 item 3).
EVAL_PROCESS_SCORES = {"multi_add_boxed": {"shown_work": lambda row, text: shown_work(text, int(row["n"]))}}


def _eval_callback(tokenizer, eval_dataset, budget: int, spec: RunSpec, history: list, train_logs: list,
                   progress_bar, harder_eval_sets: dict | None = None, start_model=None):
    from transformers import TrainerCallback

    class SuccessCallback(TrainerCallback):
        """Sampled success on the held-out prompts every `eval_every` steps (same seed each time), and the
        trainer's own metrics of each logging window."""

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if progress_bar is not None:
                progress_bar.update(1)
            if state.global_step % spec.eval_every == 0 or state.global_step == spec.max_steps:
                record(model, state.global_step)

        def on_log(self, args, state, control, logs=None, **kwargs):
            # TRL's averages over the window (e.g. ppm/frac_rows_filtered, frac_reward_zero_std, arg/inserted_rows)
            kept = {name: value for name, value in (logs or {}).items() if isinstance(value, (int, float))}
            if kept:
                train_logs.append({"step": state.global_step, **kept})

    def record(model, step: int):
        # Sampled at the training temperature, then greedy; each restores the RNG, so neither changes the run. The
        # last evaluation keeps its first completions of each (what the policy writes at the end, e.g. its format).
        keep = KEPT_COMPLETIONS if step == spec.max_steps else 0
        scores = EVAL_PROCESS_SCORES.get(eval_dataset[0]["env"])
        metrics = evaluate_policy(model, tokenizer, eval_dataset, budget, seed=1234, keep_completions=keep,
                                  process_scores=scores, start_model=start_model)
        greedy = evaluate_policy(model, tokenizer, eval_dataset, budget, temperature=0.0, keep_completions=keep)
        metrics.update({f"greedy_{key}": greedy[key] for key in ("all_correct", "per_subproblem", "completions")
                        if key in greedy})
        if spec.pass_k and step == spec.max_steps:
            metrics.update(evaluate_pass_at_k(model, tokenizer, eval_dataset, budget, spec.pass_k, seed=4321))
        if spec.harder_horizons and step == spec.max_steps:
            metrics["harder"] = {}
            for m in spec.harder_horizons:
                harder = harder_eval_sets[m]
                found = evaluate_policy(model, tokenizer, harder, completion_budget(harder[0]["env"], m), seed=1234,
                                        process_scores=scores)
                metrics["harder"][str(m)] = {key: value for key, value in found.items() if key != "per_point"}
        history.append({"step": step, "samples": step * spec.samples_per_step, **metrics})
        if progress_bar is not None:
            progress_bar.set_postfix(all_correct=f"{metrics['all_correct']:.3f}",
                                     per_sub=f"{metrics['per_subproblem']:.3f}")

    return SuccessCallback(), record


def train_variant(model_path: str, spec: RunSpec, eval_dataset, output_dir: str, train_size: int = 2000,
                  progress: bool = True, save_dir: str | None = None, harder_eval_sets: dict | None = None) -> dict:
    """Train `spec` from the checkpoint at `model_path`; return its success history (samples → rates).

    The initial evaluation (step 0) is included. With `save_dir`, the trained policy and tokenizer are saved there
    (loadable with `from_pretrained`). `harder_eval_sets[m]`: the held-out rows at horizon m, one per
    `spec.harder_horizons`. Runs on one thread with deterministic algorithms (`deterministic_cpu`), so the same spec
    gives the same numbers whatever OMP_NUM_THREADS says.
    """
    missing = sorted(set(spec.harder_horizons) - set(harder_eval_sets or {}))
    if missing:
        raise ValueError(f"spec.harder_horizons asks for evaluations at n = {missing}; pass their rows in "
                         "harder_eval_sets")
    with deterministic_cpu():
        return _train_variant(model_path, spec, eval_dataset, output_dir, train_size, progress, save_dir,
                              harder_eval_sets)


def _train_variant(model_path: str, spec: RunSpec, eval_dataset, output_dir: str, train_size: int,
                   progress: bool, save_dir: str | None, harder_eval_sets: dict | None) -> dict:
    import torch
    from tqdm.auto import tqdm
    from transformers import PrinterCallback

    from ..envs import make_dataset
    from ..trainers.base import RunReport

    torch.manual_seed(spec.seed)
    env = eval_dataset[0]["env"]
    model, tokenizer = load_policy(model_path)
    budget = completion_budget(env, spec.n)
    train_dataset = make_dataset(env, spec.n, train_size, seed=50_000 + spec.seed)
    history: list[dict] = []
    train_logs: list[dict] = []
    bar = tqdm(total=spec.max_steps, desc=f"{spec.variant:>10} n={spec.n}", disable=not progress)
    # KL(π ‖ π_start) at each evaluation (issue 40 item 4): the starting weights, loaded again, frozen
    start_model, _ = load_policy(model_path)
    callback, record = _eval_callback(tokenizer, eval_dataset, budget, spec, history, train_logs, bar,
                                      harder_eval_sets, start_model)
    record(model, 0)
    trainer = build_variant_trainer(spec, model, tokenizer, train_dataset, output_dir, budget)
    trainer.remove_callback(PrinterCallback)  # the logs go into the result (train_logs), not onto the terminal
    trainer.remove_callback(RunReport)  # and the run's summary too (GRPOTrainer, "sparse", has none)
    trainer.add_callback(callback)
    start = time.time()
    trainer.train()
    bar.close()
    result = {"spec": asdict(spec), "history": history, "train_logs": train_logs,
              "train_seconds": time.time() - start, "kernels": kernels_in_use(), "cpu": cpu_model()}
    if save_dir is not None:
        trainer.model.save_pretrained(save_dir)
        tokenizer.save_pretrained(save_dir)
        result["model_dir"] = save_dir
    return result


def train_variants(model_path: str, specs: list[RunSpec], eval_dataset, output_dir: str, workers: int = 1,
                   save_dirs: dict[int, str] | None = None, train_size: int = 2000) -> list[dict]:
    """`train_variant` for each spec (output in `output_dir/<variant>_s<seed>`), `workers` at a time in separate
    processes (one thread each); results in the order of `specs`. `save_dirs[i]` saves spec i's policy."""
    import os

    save_dirs = save_dirs or {}
    jobs = [(model_path, spec, eval_dataset, os.path.join(output_dir, f"{spec.variant}_s{spec.seed}"), train_size,
             workers == 1, save_dirs.get(i)) for i, spec in enumerate(specs)]
    if workers == 1 or len(jobs) == 1:
        return [train_variant(*job) for job in jobs]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    results: list[dict | None] = [None] * len(jobs)
    from ..quiet import quiet_third_party

    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=multiprocessing.get_context("spawn"),
                             initializer=quiet_third_party) as pool:
        futures = {pool.submit(train_variant, *job): i for i, job in enumerate(jobs)}
        from concurrent.futures import as_completed

        for future in as_completed(futures):
            i = futures[future]
            results[i] = future.result()
            last = results[i]["history"][-1]
            print(f"      done: {VARIANT_LABELS[specs[i].variant]}, seed {specs[i].seed}: all-correct "
                  f"{last['all_correct']:.3f}, per-sub-problem {last['per_subproblem']:.3f} "
                  f"({results[i]['train_seconds']:.0f}s)", flush=True)
    return results


def plot_histories(results: list[dict], path: str, title: str) -> None:
    """Success vs training samples, one line per run (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for result in results:
        variant = result["spec"]["variant"]
        samples = [h["samples"] for h in result["history"]]
        for ax, key in zip(axes, ("all_correct", "per_subproblem")):
            ax.plot(samples, [h[key] for h in result["history"]], marker="o", label=VARIANT_LABELS[variant])
    for ax, label in zip(axes, ("all-correct success (sampled, T=1)", "per-sub-problem accuracy")):
        ax.set_xlabel("training samples")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
