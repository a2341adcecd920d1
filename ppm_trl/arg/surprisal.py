"""ARG's suffix surprisal and the prefix length a guidance level asks for ("Balancing Reference Guidance and Free
Generation in Trajectory Rollouts for Reasoning RL", §3.3, §4.1).

The trainer scores the reference once under the current model; its per-token log-probs give the suffix surprisals
S_t = −Σ_{j≥t} log π(r_j | x, r_<j) (eq. 4) and, per guidance level α, the latest prefix length t with S_t ≥ α·S_0.
torch + stdlib only, float64.
"""

from __future__ import annotations

import torch

# A log-prob above this is not a log-prob; at or below it, a positive value is rounding noise and is read as 0
# (so S_t never increases with t and 0 ≤ S_t/S_0 ≤ 1 holds exactly, Lemma B.1).
_LOGPROB_TOLERANCE = 1e-3


def check_alpha(alpha: float) -> float:
    """A guidance level α as a float; ValueError unless it lies in (0, 1]."""
    alpha = float(alpha)
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"guidance level alpha must lie in (0, 1], got {alpha}")
    return alpha


def _as_logprob_matrix(token_logprobs, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) float64 log-probs with padding zeroed, and the (B, L) bool mask (right padding only)."""
    logprobs = torch.as_tensor(token_logprobs).detach().to("cpu", torch.float64)
    if logprobs.dim() != 2:
        raise ValueError(f"token_logprobs must be 2-D (B, L) here, got shape {tuple(logprobs.shape)}")
    if mask is None:
        mask = torch.ones_like(logprobs, dtype=torch.bool)
    mask = torch.as_tensor(mask).detach().to("cpu").bool()
    if mask.shape != logprobs.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match token_logprobs {tuple(logprobs.shape)}")
    if mask.shape[1] > 1 and bool((mask[:, 1:] & ~mask[:, :-1]).any()):
        row = int((mask[:, 1:] & ~mask[:, :-1]).any(dim=1).nonzero()[0])
        raise ValueError(f"mask row {row} is not right-padded (True tokens then False padding)")
    real = torch.where(mask, logprobs, torch.zeros_like(logprobs))
    if bool(torch.isnan(real).any()):
        row = int(torch.isnan(real).any(dim=1).nonzero()[0])
        raise ValueError(f"token_logprobs row {row} contains NaN")
    if bool((real > _LOGPROB_TOLERANCE).any()):
        row = int((real > _LOGPROB_TOLERANCE).any(dim=1).nonzero()[0])
        raise ValueError(f"token_logprobs row {row} has a positive value > {_LOGPROB_TOLERANCE}: not a log-prob")
    return real.clamp(max=0.0), mask


def suffix_surprisals(token_logprobs, mask=None) -> torch.Tensor:
    """S_t = −Σ_{j≥t} log π(r_j | …) for t = 0..L (eq. 4); S_0 is the whole reference, S_L = 0.

    `token_logprobs` (L,) → (L + 1,); (B, L) with a right-padding `mask` → (B, L + 1), where S_t = 0 for t at or
    past a row's length. A reverse cumulative sum, float64.
    """
    squeeze = torch.as_tensor(token_logprobs).dim() == 1
    if squeeze:
        token_logprobs = torch.as_tensor(token_logprobs).unsqueeze(0)
        mask = None if mask is None else torch.as_tensor(mask).unsqueeze(0)
    logprobs, _ = _as_logprob_matrix(token_logprobs, mask)
    suffix = torch.flip(torch.cumsum(torch.flip(-logprobs, dims=[1]), dim=1), dims=[1])
    surprisal = torch.cat([suffix, torch.zeros_like(suffix[:, :1])], dim=1)
    return surprisal[0] if squeeze else surprisal


def batched_surprisal_prefix_lengths(token_logprobs, mask, alpha) -> torch.Tensor:
    """Latest prefix length t in [0, n_b) with S_t ≥ α·S_0 for every row b (§4.1, before boundary snapping).

    `token_logprobs` (B, L) and right-padding `mask` (B, L) (None = no padding); `alpha` a float or a (B,) tensor.
    α = 1 gives 0 (the empty prefix). A row with α < 1 needs 0 < S_0 < ∞ (Alg. 1, line 6: a reference whose
    surprisal is 0 or infinite gets no continuations); otherwise ValueError. Returns a (B,) long tensor.
    """
    logprobs, mask = _as_logprob_matrix(token_logprobs, mask)
    batch, length = logprobs.shape
    alphas = torch.as_tensor(alpha, dtype=torch.float64).detach().cpu().reshape(-1)
    if alphas.numel() not in (1, batch):
        raise ValueError(f"alpha must be a float or one level per row ({batch}), got {alphas.numel()} values")
    alphas = alphas.expand(batch).clone()
    for value in alphas.tolist():
        check_alpha(value)
    surprisal = suffix_surprisals(logprobs, mask)
    total = surprisal[:, 0]
    guided = alphas < 1.0
    unusable = guided & ~(torch.isfinite(total) & (total > 0))
    if bool(unusable.any()):
        row = int(unusable.nonzero()[0])
        raise ValueError(
            f"row {row}: reference surprisal S_0 = {float(total[row])} is not in (0, inf), so no prefix level "
            "alpha < 1 is defined (paper Alg. 1 line 6: such a reference gets no continuations, only fallback)"
        )
    # Guided rows have S_0 > 0 and S_n = 0, so the latest qualifying t is < n; t = 0 always qualifies.
    if length == 0:
        return torch.zeros(batch, dtype=torch.long)
    qualifies = (surprisal[:, :length] >= alphas[:, None] * total[:, None]) & mask
    positions = torch.arange(length).expand(batch, length)
    latest = torch.where(qualifies, positions, torch.zeros_like(positions)).amax(dim=1)
    return torch.where(guided, latest, torch.zeros_like(latest))


def surprisal_prefix_length(token_logprobs, alpha) -> int:
    """Latest t with S_t ≥ α·S_0 for one reference (1-D tensor or list of log-probs); α = 1 → 0 (empty prefix)."""
    row = torch.as_tensor(token_logprobs, dtype=torch.float64)
    if row.dim() != 1:
        raise ValueError(f"token_logprobs must be 1-D for one reference, got shape {tuple(row.shape)}")
    return int(batched_surprisal_prefix_lengths(row.unsqueeze(0), None, alpha)[0])
