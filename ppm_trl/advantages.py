"""Group maths every method shares — pure torch, no TRL: GRPO group normalisation, DAPO's zero-advantage filter,
the sparse-outcome baseline, and per-segment values expanded to tokens.

Groups are consecutive blocks of `group_size` rows (TRL's `view(-1, G)` layout). NaN marks an unscorable value (a
failed judge call, a reward function returning None): it is left out of every group statistic and its advantage is
0. Dtype (float32/float64) and device of the inputs are preserved; integer inputs become the default float dtype.

Each method's own estimators live in its folder (cf. verl's core_algos.py, one small function per estimator):
`ppm_trl/ppm/ppm_estimators.py` (PPM eq. 3, App. A–B and its baselines) and `ppm_trl/papo/papo_estimators.py` (PAPO
§4.1, §6). They take different inputs (PPM's (N, K) progress, PAPO's binary outcome and correct-subset process
scores), which only their own trainer collects; each method's config fields select its variant from one table there
(`PPM_ESTIMATORS`; PAPO's `PROCESS_NORMS` and `COMBINES`).
"""

from __future__ import annotations

from numbers import Integral

import torch


# -------------------------------------------------------------------------------------------------- helpers
def as_float(x, name: str) -> torch.Tensor:
    x = torch.as_tensor(x)
    if x.dtype == torch.bool or not x.is_floating_point():
        x = x.to(torch.get_default_dtype())
    if torch.isinf(x).any():
        raise ValueError(f"{name} contains ±inf at row {int(torch.isinf(x).nonzero()[0, 0])}; use NaN for unscorable")
    return x


def check_groups(n: int, group_size: int) -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, Integral) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if n % group_size:
        raise ValueError(f"{n} rows are not a whole number of groups of group_size={group_size}")


def check_unit_range(values: torch.Tensor, check: torch.Tensor, name: str) -> None:
    bad = check & ~torch.isnan(values) & ((values < 0) | (values > 1))
    if bad.any():
        row, col = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name} must lie in [0, 1]; row {row}, segment {col} has {float(values[row, col])}")


# ---------------------------------------------------------------------------------------------- group stats
def group_normalize(rewards, group_size: int, scale: bool | str = True, eps: float = 1e-4) -> torch.Tensor:
    """GRPO group normalisation per column: (r − mean_group) / (std + eps), TRL's `scale_rewards` semantics.

    `rewards` is (N,) or (N, K); each column is normalised separately over consecutive blocks of `group_size` rows.
    `scale`: True or "group" divides by the group's std, "batch" by the std of the whole column (TRL's
    `scale_rewards="batch"`: mean per group, std over the batch), False or "none" only centres. The std is the
    sample (Bessel-corrected) std, as in TRL and verl. NaN entries are excluded from every mean and std and get 0;
    a group with a single non-NaN entry has std 0 (its advantage is 0 after centring). A group whose present values
    are all identical gets exactly 0: a float mean such as 16·(3/5 + 1)/16 is off by an ulp, and that residue must
    neither survive the zero-advantage filter nor be blown up by the std division.
    """
    scale = {True: "group", False: "none"}.get(scale, scale) if isinstance(scale, bool) else scale
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale must be True/False or one of 'group', 'batch', 'none'; got {scale!r}")
    rewards = as_float(rewards, "rewards")
    if rewards.dim() not in (1, 2):
        raise ValueError(f"rewards must be (N,) or (N, K), got shape {tuple(rewards.shape)}")
    check_groups(rewards.shape[0], group_size)
    grouped = rewards.reshape(-1, group_size, *rewards.shape[1:])
    present = ~torch.isnan(grouped)
    count = present.sum(dim=1, keepdim=True)
    filled = torch.where(present, grouped, torch.zeros_like(grouped))
    mean = filled.sum(dim=1, keepdim=True) / count.clamp(min=1)
    highest = torch.where(present, grouped, torch.full_like(grouped, -float("inf"))).amax(dim=1, keepdim=True)
    lowest = torch.where(present, grouped, torch.full_like(grouped, float("inf"))).amin(dim=1, keepdim=True)
    constant = highest <= lowest  # also true for groups with no present value
    centred = torch.where(present & ~constant, grouped - mean, torch.zeros_like(grouped))
    if scale == "group":
        variance = (centred**2).sum(dim=1, keepdim=True) / (count - 1).clamp(min=1)
        centred = centred / (variance.sqrt() + eps)
    elif scale == "batch":
        centred = centred / (_column_std(rewards).reshape(1, 1, *rewards.shape[1:]) + eps)
    return centred.reshape(rewards.shape)


def _column_std(values: torch.Tensor) -> torch.Tensor:
    """Sample std of each column over all rows (NaN excluded), computed around the exact column mean: (K,) or ()."""
    present = ~torch.isnan(values)
    count = present.sum(dim=0)
    filled = torch.where(present, values, torch.zeros_like(values))
    mean = filled.sum(dim=0) / count.clamp(min=1)
    squares = torch.where(present, (values - mean) ** 2, torch.zeros_like(values)).sum(dim=0)
    return (squares / (count - 1).clamp(min=1)).sqrt()


def normalize_then_sum(rewards_per_func, weights, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """(N,) Σ_f w_f·(r_f − mean_g r_f)/(std_g r_f + eps): each reward function normalised within its group, then
    weighted and summed — TRL's `multi_objective_aggregation="normalize_then_sum"` before its final normalisation
    over the batch (`batch_normalize`). `rewards_per_func` is (N, F), `weights` (F,). A NaN value stays out of its
    function's group statistics and adds 0; a row whose every function is NaN is NaN (unscorable). A function
    constant within a group adds exactly 0 there (`group_normalize`)."""
    rewards = as_float(rewards_per_func, "rewards_per_func")
    if rewards.dim() != 2:
        raise ValueError(f"rewards_per_func must be (N, F), got shape {tuple(rewards.shape)}")
    weights = as_float(weights, "weights").to(device=rewards.device, dtype=rewards.dtype)
    if weights.shape != rewards.shape[1:]:
        raise ValueError(f"weights must have shape ({rewards.shape[1]},), got {tuple(weights.shape)}")
    total = (group_normalize(rewards, group_size, scale=True, eps=eps) * weights).sum(dim=1)
    return torch.where(torch.isnan(rewards).all(dim=1), torch.full_like(total, float("nan")), total)


def batch_normalize(values, eps: float = 1e-4) -> torch.Tensor:
    """(N,) (v − mean)/(std + eps) over the whole batch (sample std, NaN left out of both and kept NaN): the last
    step of TRL's `normalize_then_sum`."""
    values = as_float(values, "values")
    if values.dim() != 1:
        raise ValueError(f"values must be (N,), got shape {tuple(values.shape)}")
    present = ~torch.isnan(values)
    mean = torch.where(present, values, torch.zeros_like(values)).sum() / present.sum().clamp(min=1)
    return (values - mean) / (_column_std(values) + eps)


def zero_advantage_groups(advantages, group_size: int, atol: float = 1e-8) -> torch.Tensor:
    """(N/G,) bool: groups whose every advantage is (numerically) zero — DAPO's filter, PPM App. B."""
    advantages = torch.as_tensor(advantages)
    check_groups(advantages.shape[0], group_size)
    flat = advantages.reshape(advantages.shape[0] // group_size, -1)
    return (flat.abs() <= atol).all(dim=1)


def sparse_outcome_advantages(outcome, group_size: int, scale: bool | str = True, eps: float = 1e-4) -> torch.Tensor:
    """Plain GRPO on the outcome reward (the sparse-reward baseline, PPM §5.1 / App. A.1)."""
    outcome = as_float(outcome, "outcome")
    if outcome.dim() != 1:
        raise ValueError(f"outcome must be (N,), got shape {tuple(outcome.shape)}")
    return group_normalize(outcome, group_size, scale=scale, eps=eps)


# -------------------------------------------------------------------------------------------------- expansion
def expand_segment_values(values: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) per-token values: token t carries values[b, segment_ids[b, t]]; id -1 (padding) → 0."""
    values = torch.as_tensor(values)
    ids = torch.as_tensor(segment_ids, device=values.device)
    if values.dim() != 2 or ids.dim() != 2 or values.shape[0] != ids.shape[0]:
        raise ValueError(f"values must be (B, K) and segment_ids (B, T); got {tuple(values.shape)} and {tuple(ids.shape)}")
    if ids.numel() and (ids.max() >= values.shape[1] or ids.min() < -1):
        raise ValueError(f"segment_ids must lie in -1..{values.shape[1] - 1}, got range {ids.min()}..{ids.max()}")
    gathered = torch.gather(values, 1, ids.clamp(min=0).long())
    return torch.where(ids >= 0, gathered, torch.zeros_like(gathered))


def process_share(process_index: int, per_process: int) -> slice:
    """The part of a gathered batch that process `process_index` holds: every process holds `per_process` rows (or
    groups), in rank order. The one rule for a rank's slice (the seam's `local_rows`, ARG's failure scan)."""
    start = process_index * per_process
    return slice(start, start + per_process)
