"""ARG's feedback for one continuation (eq. 7) and the acceptance rule of §4.3: which candidates enter the group, and
which failed rows they replace.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def continuation_feedback(
    correct: bool, same_as_reference: bool, prefix_surprisal_ratio: float, surprisal_weighting: bool = True
) -> float:
    """W = 1{correct and ≠ reference}·S_t/S_0 (eq. 7), S_t/S_0 ∈ [0, 1] at the (snapped) cut t of this
    continuation: the fraction of the reference surprisal the model produced itself. Weighting off (§5.3 ablation):
    the indicator alone."""
    ratio = float(prefix_surprisal_ratio)
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"prefix_surprisal_ratio S_t/S_0 must lie in [0, 1], got {ratio}")
    success = bool(correct) and not bool(same_as_reference)
    if not success:
        return 0.0
    return ratio if surprisal_weighting else 1.0


@dataclass(frozen=True)
class Candidate:
    """One continuation's candidate trajectory h_t ⊕ Z for `accept_candidates`."""

    correct: bool
    same_as_reference: bool
    prefix_len: int


def accept_candidates(candidates, max_total: int = 4, max_empty: int = 4, max_guided: int = 1) -> list[int]:
    """Indices of the candidates to insert, in acceptance order (§4.3, Table 3); [] = fall back to the reference.

    Eligible: correct and not an exact copy of the reference. First the eligible empty-prefix candidates
    (prefix_len == 0) in index order, up to min(max_empty, max_total); then, while fewer than max_total, at most
    max_guided eligible non-empty-prefix candidates, shortest prefix first (ties: lowest index).
    """
    if max_total < 1 or max_empty < 0 or max_guided < 0:
        raise ValueError(
            f"need max_total >= 1, max_empty >= 0, max_guided >= 0; got {max_total}, {max_empty}, {max_guided}"
        )
    empty, guided = [], []
    for index, candidate in enumerate(candidates):
        prefix_len = candidate.prefix_len
        if isinstance(prefix_len, bool) or int(prefix_len) != prefix_len or prefix_len < 0:
            raise ValueError(f"candidate {index}: prefix_len must be an int >= 0, got {prefix_len!r}")
        if not candidate.correct or candidate.same_as_reference:
            continue
        (empty if prefix_len == 0 else guided).append(index)
    accepted = empty[: min(max_empty, max_total)]
    room = min(max_guided, max_total - len(accepted))
    guided.sort(key=lambda index: (candidates[index].prefix_len, index))
    return accepted + guided[:room]


def choose_replacement_rows(
    num_failed_rows: int, num_inserts: int, generator: torch.Generator | None = None
) -> list[int]:
    """Distinct positions in [0, num_failed_rows), uniformly at random: inserted trajectory i replaces row [i]."""
    if num_failed_rows < 0 or not 0 <= num_inserts <= num_failed_rows:
        raise ValueError(
            f"need 0 <= num_inserts <= num_failed_rows, got num_inserts={num_inserts}, num_failed_rows={num_failed_rows}"
        )
    return torch.randperm(num_failed_rows, generator=generator)[:num_inserts].tolist()
