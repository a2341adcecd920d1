"""OPSD's per-token divergence (PPM paper App. B.1, eq. 111), pure: the generalized Jensen–Shannon divergence between
the teacher's and the student's next-token distributions at each completion position.

JSD_β(T ‖ S) = β · KL(T ‖ M) + (1 − β) · KL(S ‖ M), M = β · T + (1 − β) · S; β = ½ is the symmetric JSD of eq. 111.
"""

from __future__ import annotations

import math

import torch


def token_jsd(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float = 0.5,
              temperature: float = 1.0) -> torch.Tensor:
    """(B, T) JSD_β of each position's distributions; logits (B, T, V), divided by `temperature` first."""
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta must be in (0, 1) (0.5: the symmetric JSD), got {beta}")
    student = torch.log_softmax(student_logits / temperature, dim=-1)
    teacher = torch.log_softmax(teacher_logits / temperature, dim=-1)
    mixture = torch.logsumexp(torch.stack([teacher + math.log(beta), student + math.log(1.0 - beta)]), dim=0)
    kl_teacher = (teacher.exp() * (teacher - mixture)).sum(-1)
    kl_student = (student.exp() * (student - mixture)).sum(-1)
    return beta * kl_teacher + (1.0 - beta) * kl_student


def sequence_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) (1/T_i) Σ_t of each row over its own tokens (eq. 111's 1/T); a row without tokens gives 0."""
    mask = mask.to(per_token.dtype)
    return (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
