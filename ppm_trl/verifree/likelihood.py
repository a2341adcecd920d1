"""VeriFree's reward, the pure pieces (PPM paper App. B.1, eq. 110): r = exp((1/L) Σ_t log π_θ(x^ref_t | x̃, x^ref_<t)),
where x̃ is [prompt, the rollout's reasoning] — its own final output discarded — and x^ref the reference's final
output, L tokens long.

The final output starts after the last `</think>` (a thinking model: everything after its thinking is its answer),
else at the last `\\boxed` (the answer line of a non-thinking model); a text with neither has no final output, so
all of it is reasoning. The reference's final output is cut at the same place (`\\boxed{14}$.` of a MATH solution,
`\\boxed{a=3, b=7}` of a synthetic env's reference); a reference without one gives `\\boxed{<gold answer>}`.
"""

from __future__ import annotations

import torch

THINK_END = "</think>"
BOX = "\\boxed"


def final_output_start(text: str) -> int | None:
    """Character index where `text`'s final output starts, or None when it has none."""
    think = text.rfind(THINK_END)
    if think >= 0:
        return think + len(THINK_END)
    box = text.rfind(BOX)
    return box if box >= 0 else None


def split_rollout(text: str) -> tuple[str, bool]:
    """(the rollout's reasoning, whether a final output was found and discarded)."""
    start = final_output_start(text)
    return (text, False) if start is None else (text[:start], True)


def reference_final_output(reference: str, answer: str | None) -> str:
    """x^ref: the reference's own final output, else `\\boxed{answer}`."""
    start = final_output_start(reference)
    if start is not None and reference[start:].strip():
        return reference[start:].lstrip() if reference[:start].endswith(THINK_END) else reference[start:]
    if answer is None or not str(answer).strip():
        raise ValueError(f"the reference has no final output (no \\boxed, no {THINK_END}) and the row no answer: "
                         f"{reference[-120:]!r}")
    return f"{BOX}{{{str(answer).strip()}}}"


def likelihood_reward(token_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) exp of the mean log-likelihood of each row's reference tokens.

    token_logps: (B, L) log π of each reference token; mask: (B, L) 1 on the row's reference tokens. A row without
    one is NaN (no reward to read)."""
    mask = mask.to(token_logps.dtype)
    count = mask.sum(dim=1)
    mean = (token_logps * mask).sum(dim=1) / count.clamp(min=1)
    return torch.where(count > 0, mean.exp(), torch.full_like(mean, float("nan")))
