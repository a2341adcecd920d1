"""PAPO's advantage estimator ("PAPO: Stabilizing Rubric Integration Training via Decoupled Advantage
Normalization", §4.1, §6) and its diagnostics — pure torch, no TRL.

A = A_out + λ·A_proc: A_out normalised over the group, A_proc over the correct subset only. The ablations of §6 are
variants chosen from one table per concept: `PROCESS_NORMS` (whose statistics A_proc uses: the correct subset, or
the whole group — Fullnorm) and `COMBINES` (how outcome and process meet: decoupled, or one normalisation of their
product — Mult); `PAPOConfig`'s accepted values are their keys. Groups, NaN and dtypes as in `ppm_trl.advantages`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ..advantages import as_float, check_groups, check_unit_range, group_normalize


# ---------------------------------------------------------------------------------------------- the variants
def _correct_subset_process_advantage(outcome, process, scored, group_size: int, eps: float) -> torch.Tensor:
    """PAPO §4.1 step 2: statistics over the correct subset C only; 0 for incorrect rows; the whole group 0 when
    |C| < 2."""
    nan = torch.full_like(outcome, float("nan"))
    a_proc = group_normalize(torch.where(scored, process, nan), group_size, scale=True, eps=eps)
    enough = scored.view(-1, group_size).sum(dim=1, keepdim=True) >= 2
    a_proc = torch.where(enough, a_proc.view(-1, group_size), torch.zeros_like(a_proc.view(-1, group_size)))
    return a_proc.reshape(-1)


def _full_process_advantage(outcome, process, scored, group_size: int, eps: float) -> torch.Tensor:
    """Fullnorm (PAPO §6): incorrect rows enter with r_proc = 0, normalised over the whole group."""
    nan = torch.full_like(outcome, float("nan"))
    incorrect = (outcome == 0)
    filled = torch.where(scored, process, torch.where(incorrect, torch.zeros_like(process), nan))
    return group_normalize(filled, group_size, scale=True, eps=eps)


# process_norm → A_proc from (outcome, process, scored = correct with a process score, group_size, eps).
PROCESS_NORMS = {"correct_subset": _correct_subset_process_advantage, "full": _full_process_advantage}


def _decoupled(outcome, process, group_size: int, process_norm: str, eps: float):
    """A_out over the whole group and A_proc by `process_norm` (PAPO §4.1)."""
    a_out = group_normalize(outcome, group_size, scale=True, eps=eps)
    scored = (outcome == 1) & ~torch.isnan(process)  # correct (False for a NaN outcome) and judged
    return a_out, PROCESS_NORMS[process_norm](outcome, process, scored, group_size, eps)


def _multiplicative(outcome, process, group_size: int, process_norm: str, eps: float):
    """r = r_out·r_proc with ONE GRPO normalisation (PAPO §6 "Mult"); incorrect rows are 0 whatever the judge said,
    a correct row without a process score is unscorable. A_proc is all zeros (λ unused)."""
    nan = torch.full_like(outcome, float("nan"))
    correct = outcome == 1  # False for NaN outcome
    product = torch.where(correct, process, torch.where(torch.isnan(outcome), nan, torch.zeros_like(outcome)))
    return group_normalize(product, group_size, scale=True, eps=eps), torch.zeros_like(outcome)


# combine → (A_out, A_proc) from (outcome, process, group_size, process_norm, eps).
COMBINES = {"decoupled": _decoupled, "multiplicative": _multiplicative}


# ------------------------------------------------------------------------------------------------ the estimator
def _papo_inputs(outcome, process, group_size: int, process_norm: str, combine: str):
    if process_norm not in PROCESS_NORMS:
        raise ValueError(f"process_norm must be one of {tuple(PROCESS_NORMS)}, got {process_norm!r}")
    if combine not in COMBINES:
        raise ValueError(f"combine must be one of {tuple(COMBINES)}, got {combine!r}")
    outcome = as_float(outcome, "outcome")
    process = as_float(process, "process").to(device=outcome.device, dtype=outcome.dtype)
    if outcome.dim() != 1 or process.shape != outcome.shape:
        raise ValueError(f"outcome and process must both be (N,); got {tuple(outcome.shape)} and {tuple(process.shape)}")
    check_groups(outcome.shape[0], group_size)
    bad = ~torch.isnan(outcome) & (outcome != 0) & (outcome != 1)
    if bad.any():
        row = int(bad.nonzero()[0, 0])
        raise ValueError(f"PAPO outcome must be binary 0/1 (r_out = 1[answer correct]); row {row} has {float(outcome[row])}")
    check_unit_range(process.unsqueeze(1), torch.ones_like(process.unsqueeze(1), dtype=torch.bool), "process")
    return outcome, process


def papo_components(outcome, process, group_size: int, process_norm: str = "correct_subset",
                    combine: str = "decoupled", eps: float = 1e-6,
                    outcome_advantage=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(A_out, A_proc), each (N,), for `papo_advantages`; for `combine="multiplicative"` A_proc is all zeros and
    A_out is the GRPO advantage of r_out·r_proc. `outcome_advantage` (N,), decoupled only: A_out given instead of
    normalising the binary outcome (e.g. `advantages.normalize_then_sum` of the reward functions); the binary
    outcome still decides which rows are correct. NaN there, or a NaN outcome, gives A_out = 0."""
    outcome, process = _papo_inputs(outcome, process, group_size, process_norm, combine)
    a_out, a_proc = COMBINES[combine](outcome, process, group_size, process_norm, eps)
    if outcome_advantage is not None:
        if combine != "decoupled":
            raise ValueError(f"an outcome advantage replaces A_out of combine='decoupled' only, not {combine!r} (it "
                             "normalises r_out·r_proc once: there is no separate A_out)")
        given = as_float(outcome_advantage, "outcome_advantage").to(device=outcome.device, dtype=outcome.dtype)
        if given.shape != outcome.shape:
            raise ValueError(f"outcome_advantage must be ({outcome.shape[0]},), got {tuple(given.shape)}")
        a_out = torch.where(torch.isnan(outcome), torch.zeros_like(given), torch.nan_to_num(given))
    return a_out, a_proc


def papo_advantages(outcome, process, group_size: int, lam: float = 1.0, process_norm: str = "correct_subset",
                    combine: str = "decoupled", eps: float = 1e-6, outcome_advantage=None) -> torch.Tensor:
    """(N,) PAPO advantage A = A_out + λ·A_proc (PAPO §4.1).

    A_out = (r_out − mean)/(std + ε) over the whole group; A_proc = (r_proc − mean_C)/(std_C + ε) over the correct
    subset C, 0 for incorrect rows and for the whole group when |C| < 2. The stds are sample stds (PAPO trains with
    verl, whose GRPO estimator uses `torch.std`, i.e. Bessel-corrected; ε = 1e-6 as there). `process` is NaN where
    not judged (incorrect rows, failed judge calls): a correct row with NaN process leaves C's statistics and gets
    A_proc = 0 but keeps A_out. A NaN outcome makes the row unscorable (advantage 0, outside every statistic).
    Ablations (§6): `process_norm="full"` (Fullnorm) and `combine="multiplicative"` (Mult, λ unused).
    `outcome_advantage`: A_out given instead (`papo_components`).
    """
    a_out, a_proc = papo_components(outcome, process, group_size, process_norm=process_norm, combine=combine,
                                    eps=eps, outcome_advantage=outcome_advantage)
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
                     combine: str = "decoupled", eps: float = 1e-6, atol: float = 1e-8,
                     outcome_advantage=None) -> PAPOStats:
    """The PAPO diagnostics for one batch, computed with the same arguments as `papo_advantages`."""
    outcome_t, process_t = _papo_inputs(outcome, process, group_size, process_norm, combine)
    a_out, a_proc = papo_components(outcome_t, process_t, group_size, process_norm, combine, eps, outcome_advantage)
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
