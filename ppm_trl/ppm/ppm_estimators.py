"""PPM's advantage estimators ("Long-Horizon Language Model Reinforcement Learning via Progressive Point Matching",
§4–5, App. A–B) — pure torch, no TRL.

m_k = phi(c_1..c_k)/n (eq. 1), r_k = m_k − m_{k−1} with m_0 = 0 (eq. 3, Alg. 1), outcome added to every segment
(App. B), A_{i,k} = r_{i,k} − mean_j r_{j,k} per segment index, no std division by default (App. B). A token's
advantage is its own segment's (the segment-level estimator Y_3, App. A eq. 10), not a reward-to-go. The
trajectory-level estimator (App. A eq. 9) and the exact-order and process-reward baselines (App. B.1) share the
signature, and `PPM_ESTIMATORS` is the one table from which `PPMConfig.granularity` × `progress_mode` pick one.
Groups, NaN and dtypes as in `ppm_trl.advantages`.
"""

from __future__ import annotations

import torch

from ..advantages import as_float, check_unit_range, group_normalize


def _valid_mask(valid, like: torch.Tensor) -> torch.Tensor:
    if valid is None:
        return torch.ones_like(like, dtype=torch.bool)
    valid = torch.as_tensor(valid, device=like.device)
    if valid.shape != like.shape:
        raise ValueError(f"valid must have shape {tuple(like.shape)} like progress, got {tuple(valid.shape)}")
    return valid.bool()


def _outcome_column(outcome, like: torch.Tensor) -> torch.Tensor:
    outcome = as_float(outcome, "outcome").to(device=like.device, dtype=like.dtype)
    if outcome.shape != like.shape[:1]:
        raise ValueError(f"outcome must have shape ({like.shape[0]},), got {tuple(outcome.shape)}")
    return outcome


def _segment_inputs(values, valid, name: str):
    """(N, K) float values in [0, 1] on valid segments, the (N, K) valid mask, and the (N,) rows with a NaN there."""
    values = as_float(values, name)
    if values.dim() != 2:
        raise ValueError(f"{name} must be (N, K), got shape {tuple(values.shape)}")
    valid = _valid_mask(valid, values)
    check_unit_range(values, valid, name)
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
    progress = as_float(progress, "progress")
    if progress.dim() == 2:
        segment = ppm_segment_rewards(progress, valid=valid, add_outcome=False)
        final = segment.sum(dim=1)  # telescopes to the final monotone progress
    elif progress.dim() == 1:
        if valid is not None:
            raise ValueError("valid only applies to (N, K) progress")
        check_unit_range(progress.unsqueeze(1), torch.ones_like(progress.unsqueeze(1), dtype=torch.bool), "progress")
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


# ------------------------------------------------------------------------------------------------ the variants
# (granularity, progress_mode) → estimator. All share one signature: (values (N, K), outcome (N,), group_size,
# add_outcome, scale, eps, valid, outcome_weight) → (N, K). The config's accepted values are this table's keys.
PPM_ESTIMATORS = {
    ("segment", "ppm"): ppm_segment_advantages,
    ("segment", "exact_order"): ppm_segment_advantages,  # the exact-order progress feeds the segment estimator
    ("segment", "process_reward"): process_reward_advantages,
    ("trajectory", "ppm"): ppm_trajectory_advantages,
    ("trajectory", "exact_order"): ppm_trajectory_advantages,
}


def accepted_granularities() -> tuple[str, ...]:
    """The granularities `PPM_ESTIMATORS` has an estimator for, in table order (what `PPMConfig` accepts)."""
    return tuple(dict.fromkeys(granularity for granularity, _ in PPM_ESTIMATORS))


def accepted_progress_modes() -> tuple[str, ...]:
    """The progress modes `PPM_ESTIMATORS` has an estimator for, in table order (what `PPMConfig` accepts)."""
    return tuple(dict.fromkeys(mode for _, mode in PPM_ESTIMATORS))


GRANULARITIES, PROGRESS_MODES = accepted_granularities(), accepted_progress_modes()  # the built-in table's

# The pairs of accepted values that name no estimator, and why.
UNDEFINED_ESTIMATORS = {
    ("trajectory", "process_reward"): "the process-reward baseline (App. B.1) scores each chunk alone, so it is "
                                      "segment-level only",
}


def _either(values) -> str:
    quoted = [repr(value) for value in values]
    return " or ".join(quoted) if len(quoted) < 3 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def ppm_estimator(granularity: str, progress_mode: str):
    """The PPM-family estimator that `PPMConfig.granularity` × `progress_mode` select (`PPM_ESTIMATORS`); an undefined
    pair is a ValueError (raised when the config is built)."""
    granularities, modes = accepted_granularities(), accepted_progress_modes()
    if granularity not in granularities or progress_mode not in modes:
        raise ValueError(f"no PPM estimator for granularity={granularity!r}, progress_mode={progress_mode!r}: "
                         f"granularity is {_either(granularities)}, progress_mode {_either(modes)}")
    if (granularity, progress_mode) not in PPM_ESTIMATORS:
        why = UNDEFINED_ESTIMATORS.get((granularity, progress_mode), "PPM_ESTIMATORS has no entry for the pair")
        raise ValueError(f"granularity={granularity!r} with progress_mode={progress_mode!r} is not an estimator: {why}")
    return PPM_ESTIMATORS[granularity, progress_mode]
