"""Small pieces the three trainers share: dataset checks, the outcome reward, process slicing, logging fixes."""

from __future__ import annotations

from typing import Any

import torch

from ..text import completion_text, problem_text  # noqa: F401  (re-exported for trainers)


def check_columns(dataset, required: dict[str, str], method: str) -> None:
    """Raise a ValueError naming the first missing/malformed column and row.

    `required` maps a column name to the kind of value it must hold: "str" (non-empty string), "list" (non-empty
    list of non-empty strings) or "any". Iterable datasets are checked lazily (only their column names).
    """
    if dataset is None:
        return
    datasets = dataset.values() if isinstance(dataset, dict) else [dataset]
    for ds in datasets:
        columns = getattr(ds, "column_names", None) or []
        for column, kind in required.items():
            if column not in columns:
                raise ValueError(
                    f"{method} needs a `{column}` column in the dataset; found columns {sorted(columns)}. "
                    f"See the dataset format in the README (`ppm-trl prepare` builds reasoning_points/graph)."
                )
            if not hasattr(ds, "__len__"):
                continue
            for row_index, value in enumerate(ds[column]):
                problem = _column_problem(value, kind)
                if problem:
                    raise ValueError(f"{method}: column `{column}`, row {row_index}: {problem}")


def _column_problem(value: Any, kind: str) -> str | None:
    if kind == "str" and (not isinstance(value, str) or not value.strip()):
        return f"expected a non-empty string, got {value!r:.80}"
    if kind == "list":
        if not isinstance(value, (list, tuple)) or not value:
            return f"expected a non-empty list of strings, got {value!r:.80}"
        if any(not isinstance(v, str) or not v.strip() for v in value):
            return "every item must be a non-empty string"
    return None


def weighted_outcome(rewards_per_func: torch.Tensor, reward_weights: torch.Tensor) -> torch.Tensor:
    """The scalar outcome reward TRL would use (`sum_then_normalize`): Σ_f w_f·r_f, NaN when every function is NaN."""
    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    outcome = (rewards_per_func * reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    outcome[unscorable] = torch.nan
    return outcome


def process_slice(trainer, num_local_rows: int) -> slice:
    """Rows of the gathered batch that belong to this process (TRL's own slicing)."""
    start = trainer.accelerator.process_index * num_local_rows
    return slice(start, start + num_local_rows)


def replace_logged_advantages(trainer, per_row_values: torch.Tensor) -> None:
    """Swap the scalar advantages TRL just logged for ours: one float per gathered row (never a list)."""
    logged = trainer._logs["advantages"]
    for _ in range(min(len(per_row_values), len(logged))):
        logged.pop()
    logged.extend(per_row_values.float().tolist())


def recount_loss_tokens(trainer, output: dict) -> None:
    """Recompute `num_items_in_batch` after rows were removed from the loss (it is a global token count)."""
    loss_mask = output["completion_mask"]
    if "tool_mask" in output:
        loss_mask = loss_mask * output["tool_mask"]
    output["num_items_in_batch"] = trainer.accelerator.gather(loss_mask.sum()).sum()


def log_metric(trainer, name: str, value: float) -> None:
    mode = "train" if trainer.model.training else "eval"
    trainer._metrics[mode][name].append(float(value))


def install_judge_stats(trainer, scorer) -> None:
    """Log judge/* metrics (calls, cache hits, failures, retries, latency, cost) when a scorer calls a judge."""
    from ..scorers import scorer_judge

    judge = scorer_judge(scorer)
    if judge is not None:
        from ..judge import JudgeStatsCallback

        JudgeStatsCallback(judge).install(trainer)
