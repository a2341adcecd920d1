"""Advantage estimators for PPM and PAPO — pure torch, one small function per estimator (cf. verl core_algos.py).

Groups are consecutive blocks of `group_size` rows (TRL's `view(-1, G)` layout). NaN marks an unscorable value (a
failed judge call, a reward function returning None): it is left out of every group statistic and its advantage is
0. Dtype (float32/float64) and device of the inputs are preserved; integer inputs become the default float dtype.

PPM ("Long-Horizon Language Model Reinforcement Learning via Progressive Point Matching", §4–5, App. A–B):
  m_k = phi(c_1..c_k)/n (eq. 1), r_k = m_k − m_{k−1} with m_0 = 0 (eq. 3, Alg. 1), outcome added to every segment
  (App. B), A_{i,k} = r_{i,k} − mean_j r_{j,k} per segment index, no std division by default (App. B). A token's
  advantage is its own segment's (the segment-level estimator Y_3, App. A eq. 10), not a reward-to-go.
PAPO ("PAPO: Stabilizing Rubric Integration Training via Decoupled Advantage Normalization", §4):
  A = A_out + λ·A_proc; A_out normalised over the group, A_proc over the correct subset only.

There is no registry of estimator names: the estimators take different inputs (PPM's (N, K) progress, PAPO's binary
outcome and correct-subset process scores), which only their own trainer collects, so a name could never select
another trainer's estimator. Each trainer calls its functions directly; PPM's config fields `granularity` and
`progress_mode` (validated when the config is built) select one through `ppm_estimator`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from numbers import Integral

import torch

PROCESS_NORMS = ("correct_subset", "full")
COMBINES = ("decoupled", "multiplicative")


# -------------------------------------------------------------------------------------------------- helpers
def _as_float(x, name: str) -> torch.Tensor:
    x = torch.as_tensor(x)
    if x.dtype == torch.bool or not x.is_floating_point():
        x = x.to(torch.get_default_dtype())
    if torch.isinf(x).any():
        raise ValueError(f"{name} contains ±inf at row {int(torch.isinf(x).nonzero()[0, 0])}; use NaN for unscorable")
    return x


def _check_groups(n: int, group_size: int) -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, Integral) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if n % group_size:
        raise ValueError(f"{n} rows are not a whole number of groups of group_size={group_size}")


def _check_unit_range(values: torch.Tensor, check: torch.Tensor, name: str) -> None:
    bad = check & ~torch.isnan(values) & ((values < 0) | (values > 1))
    if bad.any():
        row, col = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name} must lie in [0, 1]; row {row}, segment {col} has {float(values[row, col])}")


def _valid_mask(valid, like: torch.Tensor) -> torch.Tensor:
    if valid is None:
        return torch.ones_like(like, dtype=torch.bool)
    valid = torch.as_tensor(valid, device=like.device)
    if valid.shape != like.shape:
        raise ValueError(f"valid must have shape {tuple(like.shape)} like progress, got {tuple(valid.shape)}")
    return valid.bool()


def _outcome_column(outcome, like: torch.Tensor) -> torch.Tensor:
    outcome = _as_float(outcome, "outcome").to(device=like.device, dtype=like.dtype)
    if outcome.shape != like.shape[:1]:
        raise ValueError(f"outcome must have shape ({like.shape[0]},), got {tuple(outcome.shape)}")
    return outcome


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
    rewards = _as_float(rewards, "rewards")
    if rewards.dim() not in (1, 2):
        raise ValueError(f"rewards must be (N,) or (N, K), got shape {tuple(rewards.shape)}")
    _check_groups(rewards.shape[0], group_size)
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


def zero_advantage_groups(advantages, group_size: int, atol: float = 1e-8) -> torch.Tensor:
    """(N/G,) bool: groups whose every advantage is (numerically) zero — DAPO's filter, PPM App. B."""
    advantages = torch.as_tensor(advantages)
    _check_groups(advantages.shape[0], group_size)
    flat = advantages.reshape(advantages.shape[0] // group_size, -1)
    return (flat.abs() <= atol).all(dim=1)


def sparse_outcome_advantages(outcome, group_size: int, scale: bool | str = True, eps: float = 1e-4) -> torch.Tensor:
    """Plain GRPO on the outcome reward (the sparse-reward baseline, PPM §5.1 / App. A.1)."""
    outcome = _as_float(outcome, "outcome")
    if outcome.dim() != 1:
        raise ValueError(f"outcome must be (N,), got shape {tuple(outcome.shape)}")
    return group_normalize(outcome, group_size, scale=scale, eps=eps)


# ------------------------------------------------------------------------------------------------------ PPM
def _segment_inputs(values, valid, name: str):
    """(N, K) float values in [0, 1] on valid segments, the (N, K) valid mask, and the (N,) rows with a NaN there."""
    values = _as_float(values, name)
    if values.dim() != 2:
        raise ValueError(f"{name} must be (N, K), got shape {tuple(values.shape)}")
    valid = _valid_mask(valid, values)
    _check_unit_range(values, valid, name)
    return values, valid, (torch.isnan(values) & valid).any(dim=1)


def _finish_segment_rewards(rewards, unscorable, valid, outcome, add_outcome: bool, outcome_weight: float):
    """+ outcome_weight·outcome on every segment, 0 on invalid (empty) segments, NaN rows where unscorable."""
    if add_outcome:
        if outcome is None:
            raise ValueError("outcome is required when add_outcome=True")
        outcome = _outcome_column(outcome, rewards)
        unscorable = unscorable | torch.isnan(outcome)
        rewards = rewards + outcome_weight * torch.nan_to_num(outcome).unsqueeze(1)
    rewards = torch.where(valid, rewards, torch.zeros_like(rewards))
    return torch.where(unscorable.unsqueeze(1), torch.full_like(rewards, float("nan")), rewards)


def ppm_segment_rewards(progress, outcome=None, add_outcome: bool = True, valid=None,
                        outcome_weight: float = 1.0) -> torch.Tensor:
    """(N, K) segment rewards r_k = m_k − m_{k−1} (+ outcome_weight·outcome), PPM eq. 3 / Alg. 1 / App. B.

    `progress` (N, K) holds m_1..m_K in [0, 1], each judged on the full prefix c_1..c_k. The state only grows, so
    m_k = max(m_k, m_{k−1}) is enforced. An invalid (empty) segment gets reward 0 — neither progress nor outcome —
    and its progress value is ignored (m carries over). A row with NaN progress on a valid segment, or a NaN outcome
    when `add_outcome`, is unscorable: the whole row is NaN.
    """
    progress, valid, unscorable = _segment_inputs(progress, valid, "progress")
    measured = torch.where(valid & ~torch.isnan(progress), progress, torch.zeros_like(progress))
    monotone = torch.cummax(measured, dim=1).values
    rewards = monotone - torch.cat([torch.zeros_like(monotone[:, :1]), monotone[:, :-1]], dim=1)
    return _finish_segment_rewards(rewards, unscorable, valid, outcome, add_outcome, outcome_weight)


def ppm_segment_advantages(progress, outcome, group_size: int, add_outcome: bool = True, scale: bool | str = False,
                           eps: float = 1e-4, valid=None, outcome_weight: float = 1.0) -> torch.Tensor:
    """(N, K) segment-level PPM advantages: `ppm_segment_rewards` normalised per group and segment index.

    Empty segments keep reward 0 inside their position's group mean (our reading of App. B: "empty chunks ...
    are assigned progressive point matching rewards of zero for advantage calculations"). Unscorable rows → 0.
    Expand to tokens with `segments.expand_segment_values`.
    """
    rewards = ppm_segment_rewards(progress, outcome, add_outcome=add_outcome, valid=valid,
                                  outcome_weight=outcome_weight)
    return group_normalize(rewards, group_size, scale=scale, eps=eps)


def ppm_trajectory_rewards(progress, outcome=None, add_outcome: bool = True, valid=None,
                           outcome_weight: float = 1.0) -> torch.Tensor:
    """(N,) trajectory-level PPM reward: final progress φ(s_T)/n (= Σ_k r_k, eq. 4) + outcome_weight·outcome.

    `progress` is (N,) final progress or (N, K) prefix progress (the final one is the max over valid segments; a
    completion without valid segments reached nothing). NaN as in `ppm_segment_rewards`.
    """
    progress = _as_float(progress, "progress")
    if progress.dim() == 2:
        segment = ppm_segment_rewards(progress, valid=valid, add_outcome=False)
        final = segment.sum(dim=1)  # telescopes to the final monotone progress
    elif progress.dim() == 1:
        if valid is not None:
            raise ValueError("valid only applies to (N, K) progress")
        _check_unit_range(progress.unsqueeze(1), torch.ones_like(progress.unsqueeze(1), dtype=torch.bool), "progress")
        final = progress
    else:
        raise ValueError(f"progress must be (N,) or (N, K), got shape {tuple(progress.shape)}")
    if add_outcome:
        if outcome is None:
            raise ValueError("outcome is required when add_outcome=True")
        final = final + outcome_weight * _outcome_column(outcome, final)
    return final


def ppm_trajectory_advantages(progress, outcome, group_size: int, add_outcome: bool = True, scale: bool | str = False,
                              eps: float = 1e-4, valid=None, outcome_weight: float = 1.0) -> torch.Tensor:
    """Trajectory-level PPM (App. A eq. 9): one reward φ/n (+ outcome) per completion, group-normalised and, for
    (N, K) progress, broadcast to all K segments; (N,) progress gives (N,) advantages."""
    rewards = ppm_trajectory_rewards(progress, outcome, add_outcome=add_outcome, valid=valid,
                                     outcome_weight=outcome_weight)
    advantages = group_normalize(rewards, group_size, scale=scale, eps=eps)
    progress = torch.as_tensor(progress)
    return advantages.unsqueeze(1).expand(-1, progress.shape[1]).clone() if progress.dim() == 2 else advantages


# -------------------------------------------------------------------------------------------- PPM baselines
def exact_order_progress(reached, num_points) -> torch.Tensor:
    """(N, K) progress of the "exact order" baseline (PPM App. B.1: "a reward only if the reasoning points are
    visited in the same order as in the reference trajectory").

    `reached` is a (N, K, P) bool tensor: reached[i, k, p] = point p+1 reached by prefix c_1..c_k (no closure).
    A point counts only when every earlier point of the reference order is reached too, so m_k = (longest reached
    prefix 1..j of the point list) / n. `num_points` is an int or a (N,) tensor of per-row n ≤ P (columns past a
    row's n are ignored). Order inside one segment is not observable; across segments this is what the prefix
    judgements give. Feed the result to `ppm_segment_advantages`.
    """
    reached = torch.as_tensor(reached)
    if reached.dim() != 3:
        raise ValueError(f"reached must be (N, K, P) bool, got shape {tuple(reached.shape)}")
    num_points = torch.as_tensor(num_points, device=reached.device)
    if num_points.dim() == 0:
        num_points = num_points.expand(reached.shape[0])
    if num_points.shape != reached.shape[:1] or (num_points < 1).any() or (num_points > reached.shape[2]).any():
        raise ValueError(f"num_points must be an int or ({reached.shape[0]},) tensor in 1..{reached.shape[2]}")
    inside = torch.arange(reached.shape[2], device=reached.device) < num_points.view(-1, 1, 1)
    in_order = torch.cumprod((reached.bool() & inside).long(), dim=2).sum(dim=2)
    return in_order.to(torch.get_default_dtype()) / num_points.view(-1, 1).to(torch.get_default_dtype())


def process_reward_rewards(chunk_scores, outcome=None, add_outcome: bool = True, valid=None,
                           outcome_weight: float = 1.0) -> torch.Tensor:
    """(N, K) rewards of the process-reward baseline (PPM App. B.1): r_k = φ'(c_k), each chunk judged on its own
    (score in [0, 1], no shortcutting, no finite differences), plus the outcome on valid segments (App. B.1 trains on
    the sum). Invalid segments → 0; NaN score on a valid segment or NaN outcome → NaN row."""
    scores, valid, unscorable = _segment_inputs(chunk_scores, valid, "chunk_scores")
    rewards = torch.nan_to_num(scores)
    return _finish_segment_rewards(rewards, unscorable, valid, outcome, add_outcome, outcome_weight)


def process_reward_advantages(chunk_scores, outcome, group_size: int, add_outcome: bool = True, scale: bool | str = False,
                              eps: float = 1e-4, valid=None, outcome_weight: float = 1.0) -> torch.Tensor:
    """(N, K) advantages of the process-reward baseline: `process_reward_rewards` normalised per segment index."""
    rewards = process_reward_rewards(chunk_scores, outcome, add_outcome=add_outcome, valid=valid,
                                     outcome_weight=outcome_weight)
    return group_normalize(rewards, group_size, scale=scale, eps=eps)


def ppm_estimator(granularity: str, progress_mode: str):
    """The PPM-family estimator that `PPMConfig.granularity` × `progress_mode` select; an undefined pair is a
    ValueError (raised when the config is built). All three share one signature: (values (N, K), outcome (N,),
    group_size, add_outcome, scale, eps, valid, outcome_weight) → (N, K)."""
    if granularity not in ("segment", "trajectory") or progress_mode not in ("ppm", "exact_order", "process_reward"):
        raise ValueError(f"no PPM estimator for granularity={granularity!r}, progress_mode={progress_mode!r}: "
                         "granularity is 'segment' or 'trajectory', progress_mode 'ppm', 'exact_order' or "
                         "'process_reward'")
    if progress_mode == "process_reward":
        if granularity == "trajectory":
            raise ValueError("granularity='trajectory' with progress_mode='process_reward' is not an estimator: the "
                             "process-reward baseline (App. B.1) scores each chunk alone, so it is segment-level only")
        return process_reward_advantages
    return ppm_segment_advantages if granularity == "segment" else ppm_trajectory_advantages


# ----------------------------------------------------------------------------------------------------- PAPO
def _papo_inputs(outcome, process, group_size: int, process_norm: str, combine: str):
    if process_norm not in PROCESS_NORMS:
        raise ValueError(f"process_norm must be one of {PROCESS_NORMS}, got {process_norm!r}")
    if combine not in COMBINES:
        raise ValueError(f"combine must be one of {COMBINES}, got {combine!r}")
    outcome = _as_float(outcome, "outcome")
    process = _as_float(process, "process").to(device=outcome.device, dtype=outcome.dtype)
    if outcome.dim() != 1 or process.shape != outcome.shape:
        raise ValueError(f"outcome and process must both be (N,); got {tuple(outcome.shape)} and {tuple(process.shape)}")
    _check_groups(outcome.shape[0], group_size)
    bad = ~torch.isnan(outcome) & (outcome != 0) & (outcome != 1)
    if bad.any():
        row = int(bad.nonzero()[0, 0])
        raise ValueError(f"PAPO outcome must be binary 0/1 (r_out = 1[answer correct]); row {row} has {float(outcome[row])}")
    _check_unit_range(process.unsqueeze(1), torch.ones_like(process.unsqueeze(1), dtype=torch.bool), "process")
    return outcome, process


def papo_components(outcome, process, group_size: int, process_norm: str = "correct_subset",
                    combine: str = "decoupled", eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """(A_out, A_proc), each (N,), for `papo_advantages`; for `combine="multiplicative"` A_proc is all zeros and
    A_out is the GRPO advantage of r_out·r_proc."""
    outcome, process = _papo_inputs(outcome, process, group_size, process_norm, combine)
    nan = torch.full_like(outcome, float("nan"))
    correct = outcome == 1  # False for NaN outcome
    if combine == "multiplicative":
        # r = r_out·r_proc with ONE GRPO normalisation (PAPO §6 "Mult"); incorrect rows are 0 whatever the judge
        # said, a correct row without a process score is unscorable.
        product = torch.where(correct, process, torch.where(torch.isnan(outcome), nan, torch.zeros_like(outcome)))
        return group_normalize(product, group_size, scale=True, eps=eps), torch.zeros_like(outcome)
    a_out = group_normalize(outcome, group_size, scale=True, eps=eps)
    scored = correct & ~torch.isnan(process)
    if process_norm == "correct_subset":
        # PAPO §4.1 step 2: statistics over C only; 0 for incorrect rows; whole group 0 when |C| < 2.
        a_proc = group_normalize(torch.where(scored, process, nan), group_size, scale=True, eps=eps)
        enough = scored.view(-1, group_size).sum(dim=1, keepdim=True) >= 2
        a_proc = torch.where(enough, a_proc.view(-1, group_size), torch.zeros_like(a_proc.view(-1, group_size)))
        a_proc = a_proc.reshape(-1)
    else:
        # Fullnorm (PAPO §6): incorrect rows enter with r_proc = 0, normalised over the whole group.
        incorrect = (outcome == 0)
        filled = torch.where(scored, process, torch.where(incorrect, torch.zeros_like(process), nan))
        a_proc = group_normalize(filled, group_size, scale=True, eps=eps)
    return a_out, a_proc


def papo_advantages(outcome, process, group_size: int, lam: float = 1.0, process_norm: str = "correct_subset",
                    combine: str = "decoupled", eps: float = 1e-6) -> torch.Tensor:
    """(N,) PAPO advantage A = A_out + λ·A_proc (PAPO §4.1).

    A_out = (r_out − mean)/(std + ε) over the whole group; A_proc = (r_proc − mean_C)/(std_C + ε) over the correct
    subset C, 0 for incorrect rows and for the whole group when |C| < 2. The stds are sample stds (PAPO trains with
    verl, whose GRPO estimator uses `torch.std`, i.e. Bessel-corrected; ε = 1e-6 as there). `process` is NaN where
    not judged (incorrect rows, failed judge calls): a correct row with NaN process leaves C's statistics and gets
    A_proc = 0 but keeps A_out. A NaN outcome makes the row unscorable (advantage 0, outside every statistic).
    Ablations (§6): `process_norm="full"` (Fullnorm) and `combine="multiplicative"` (Mult, λ unused).
    """
    a_out, a_proc = papo_components(outcome, process, group_size, process_norm=process_norm, combine=combine,
                                    eps=eps)
    return a_out + lam * a_proc


@dataclass
class PAPOStats:
    """Diagnostics the PAPO trainer logs (PAPO Fig. 5, 11, 12)."""

    zero_advantage_fraction: float  # rows with |A| <= atol (signal exhaustion, Fig. 5a)
    proc_active_fraction: float  # groups where A_proc moves some row: |A_proc| > atol (Fig. 12b)
    correct_min_advantage: float  # min A over correct rows; NaN when no row is correct (Fig. 11a)
    correct_fraction: float  # mean outcome over scorable rows
    process_missing_fraction: float  # correct rows whose process score is NaN (judge failures)

    def to_dict(self, prefix: str = "papo/") -> dict[str, float]:
        return {prefix + k: v for k, v in asdict(self).items()}


def papo_group_stats(outcome, process, group_size: int, lam: float = 1.0, process_norm: str = "correct_subset",
                     combine: str = "decoupled", eps: float = 1e-6, atol: float = 1e-8) -> PAPOStats:
    """The PAPO diagnostics for one batch, computed with the same arguments as `papo_advantages`."""
    outcome_t, process_t = _papo_inputs(outcome, process, group_size, process_norm, combine)
    a_out, a_proc = papo_components(outcome_t, process_t, group_size, process_norm, combine, eps)
    advantages = a_out + lam * a_proc
    # Active = A_proc changes some row's advantage: >= 2 scored correct rows is not enough, equal scores give 0.
    proc_active = (a_proc.view(-1, group_size).abs() > atol).any(dim=1) if lam != 0 else torch.zeros(1)
    correct = outcome_t == 1
    scorable = ~torch.isnan(outcome_t)
    n_correct = int(correct.sum())
    return PAPOStats(
        zero_advantage_fraction=float((advantages.abs() <= atol).float().mean()),
        proc_active_fraction=float(proc_active.float().mean()),
        correct_min_advantage=float(advantages[correct].min()) if n_correct else float("nan"),
        correct_fraction=float(outcome_t[scorable].mean()) if scorable.any() else float("nan"),
        process_missing_fraction=float((correct & torch.isnan(process_t)).sum()) / n_correct if n_correct else 0.0,
    )
