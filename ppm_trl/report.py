"""What a finished run says about itself, the same from Python and from `ppm-trl train`: the summary (steps, loss,
output dir, step times, the mean of the method's metrics) and whether anything was learned.

`MethodTrainer` prints both when `train` ends (`RunReport`, `ppm_trl/trainers/base/method_trainer.py`); `ppm-trl train` and the
example scripts print them under their own prefix, with the `ppm-trl eval` command to run next. Nothing here imports
TRL (the CLI imports this module for `--help`).
"""

from __future__ import annotations

import os

from .registry import METHODS


def step_entries(history: list[dict]) -> list[dict]:
    """The logging windows of `history`, without TRL's end-of-training entry (train_runtime, train_loss, and the
    judge's run totals): averaging that in understated every judge metric."""
    return [entry for entry in history if "train_runtime" not in entry]


def method_metrics_mean(history: list[dict]) -> dict[str, float]:
    """Mean over the logged steps of every method's metrics (`<method>/...` for each registered method: ppm/, papo/,
    arg/, ...), the judge's and the rewards' (what a user checks first)."""
    prefixes = (*(f"{name}/" for name in METHODS if "+" not in name), "judge/", "reward")
    values: dict[str, list[float]] = {}
    for entry in step_entries(history):
        for key, value in entry.items():
            if key.startswith(prefixes) and isinstance(value, (int, float)):
                values.setdefault(key, []).append(float(value))
    return {key: sum(v) / len(v) for key, v in sorted(values.items())}


def judge_totals(history: list[dict]) -> dict[str, dict[str, float]]:
    """{"judge_totals": the judge's calls, tokens, cost, ... summed over the logging windows} when a judge ran: what
    a user budgets (each window logs its own counts)."""
    names = ("judge/calls", "judge/cache_hits", "judge/failures", "judge/retries", "judge/prompt_tokens",
             "judge/completion_tokens", "judge/cost")
    entries = step_entries(history)
    if not any(name in entry for entry in entries for name in names):
        return {}
    return {"judge_totals": {name.split("/", 1)[1]: sum(float(entry.get(name, 0.0)) for entry in entries)
                             for name in names}}


def nothing_learned(history: list[dict], args) -> str | None:
    """Why no gradient reached the model, from the logged metrics; None when it learned (or nothing was logged).

    Every logged grad norm 0, or every completion filtered out of the loss: truncated completions masked
    (`mask_truncated_completions`), or a registered method's own reason (`Method.stalled`: PPM's, every group
    with zero advantage dropped). Fixes are spelled as Python settings; `ppm-trl train` prints them as flags
    (`cli.in_flag_spelling`).
    """
    def values(key):
        return [entry[key] for entry in history if isinstance(entry.get(key), (int, float))]

    reasons = []
    clipped = values("completions/clipped_ratio")
    if clipped and min(clipped) >= 1.0 and getattr(args, "mask_truncated_completions", False):
        reasons.append(f"every completion reached max_completion_length={args.max_completion_length} and was masked "
                       "out of the loss (mask_truncated_completions); raise max_completion_length, or set "
                       "mask_truncated_completions=False")
    reasons += [reason for method in METHODS.values() if method.stalled
                and (reason := method.stalled(history, args)) is not None]
    norms = values("grad_norm")
    if norms and max(norms) == 0.0 and not reasons:
        same = values("frac_reward_zero_std")
        reasons.append("every logged grad_norm is 0" + (
            "; every prompt's completions earned the same reward (frac_reward_zero_std = 1)"
            if same and min(same) >= 1.0 else ""))
    return "; ".join(reasons) or None


def nothing_learned_this_run(trainer) -> str | None:
    """`nothing_learned` over the steps this invocation trained: a resumed run is judged on its own steps (a run
    resumed at max_steps trained none, and says nothing)."""
    start = getattr(trainer, "first_step_of_this_run", 0)
    history = trainer.state.log_history
    return nothing_learned(history if not start else [entry for entry in history if entry.get("step", 0) > start],
                           trainer.args)


def training_summary(trainer, result, method: str) -> dict:
    """What a run prints when done: steps, loss, the absolute output dir, per-step wall time (TRL's `step_time`), the
    mean of the method's metrics, peak GPU memory, and each registered method's totals (`Method.run_totals`: ARG's
    guidance). `result`: what `train` returned, or
    None (from a callback at the end of training: the final log entry holds the same loss and runtime)."""
    import torch

    history = trainer.state.log_history
    final = next((entry for entry in reversed(history) if "train_loss" in entry), {})
    summary = {"method": method,
               "steps": result.global_step if result is not None else trainer.state.global_step,
               "train_loss": result.training_loss if result is not None else final.get("train_loss"),
               "output_dir": os.path.abspath(trainer.args.output_dir),
               "metrics_mean": method_metrics_mean(history),
               **judge_totals(history),
               "train_runtime_s": (result.metrics if result is not None else final).get("train_runtime"),
               "step_time_s": [entry["step_time"] for entry in history if "step_time" in entry]}
    for method in METHODS.values():
        if method.run_totals:
            summary.update(method.run_totals(trainer, history))
    if torch.cuda.is_available():
        summary["peak_torch_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    return summary
