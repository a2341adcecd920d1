"""ARG's prefix selector: a distribution over guidance levels shared across questions, learned by REINFORCE
(§3.3, §4.2; eqs. 11, 12, 18; Theorem 2), and the per-level feedback it is logged with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .surprisal import check_alpha


class PrefixSelector:
    r"""Distribution over guidance levels shared across questions, learned by REINFORCE (§3.3, §4.2).

    ρ(α) = (1 − ε)·softmax(φ)_α + ε/|A| (eq. 11). After a batch of continuations with levels α_j and feedback W_j,
    φ ← φ + η·Σ_j (W_j − b)·∇_φ log ρ(α_j) (eq. 12) with b fixed during the batch, then
    b ← (1 − β)·b + β·mean_j W_j (eq. 18). With q = softmax(φ) the exact score of the ε-mixture is
    ∇_φ log ρ(a) = (1 − ε)·q_a·(e_a − q) / ρ(a); Theorem 2: E[(W − b)·∇ log ρ(α)] = ∇_φ J(φ), J = Σ_α ρ(α)·E[W | α].
    Sampling uses the selector's own seeded generator, saved in `state_dict` so a resumed run samples identically.
    """

    def __init__(
        self,
        levels: Sequence[float] = (1.0, 0.5, 0.25),
        epsilon: float = 0.2,
        lr: float = 0.3,
        baseline_rate: float = 0.1,
        seed: int = 0,
    ):
        levels = [float(level) for level in levels]
        if not levels:
            raise ValueError("levels must be a non-empty sequence of guidance levels in (0, 1]")
        for level in levels:
            check_alpha(level)
        if len(set(levels)) != len(levels):
            raise ValueError(f"levels must be unique, got {levels}")
        if not 0.0 <= epsilon < 1.0:
            raise ValueError(f"epsilon (uniform exploration mass) must lie in [0, 1), got {epsilon}")
        if not (lr > 0 and math.isfinite(lr)):
            raise ValueError(f"lr (selector step size eta) must be a positive finite number, got {lr}")
        if not 0.0 < baseline_rate <= 1.0:
            raise ValueError(f"baseline_rate (beta) must lie in (0, 1], got {baseline_rate}")
        self.levels = tuple(levels)
        self.epsilon = float(epsilon)
        self.lr = float(lr)
        self.baseline_rate = float(baseline_rate)
        self.seed = int(seed)
        self._logits = torch.zeros(len(levels), dtype=torch.float64)
        self._baseline = 0.0
        self.num_updates = 0
        self._generator = torch.Generator().manual_seed(self.seed)

    @property
    def logits(self) -> torch.Tensor:
        return self._logits.clone()

    @property
    def baseline(self) -> float:
        return self._baseline

    def probs(self) -> torch.Tensor:
        """ρ over `levels` (eq. 11), float64; every entry ≥ ε/|A|."""
        return (1.0 - self.epsilon) * torch.softmax(self._logits, dim=0) + self.epsilon / len(self.levels)

    def sample(self, k: int) -> list[float]:
        """k i.i.d. levels from ρ (Alg. 1 line 7), drawn with the selector's own generator."""
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        if k == 0:
            return []
        indices = torch.multinomial(self.probs(), k, replacement=True, generator=self._generator)
        return [self.levels[i] for i in indices.tolist()]

    def level_indices(self, levels) -> torch.Tensor:
        """Positions of `levels` in `self.levels` (exact match, else math.isclose); unknown level → ValueError."""
        lookup = {level: i for i, level in enumerate(self.levels)}
        indices = []
        for value in torch.as_tensor(levels, dtype=torch.float64).reshape(-1).tolist():
            index = lookup.get(value)
            if index is None:
                index = next((i for i, lv in enumerate(self.levels) if math.isclose(lv, value, rel_tol=1e-9)), None)
            if index is None:
                raise ValueError(f"level {value} is not one of the selector's levels {list(self.levels)}")
            indices.append(index)
        return torch.tensor(indices, dtype=torch.long)

    def grad_log_prob(self, levels) -> torch.Tensor:
        """(k, |A|): row j = ∇_φ log ρ(α_j) = (1 − ε)·q_{α_j}·(e_{α_j} − q) / ρ(α_j)."""
        return self._score(self.level_indices(levels))

    def _score(self, indices: torch.Tensor) -> torch.Tensor:
        q = torch.softmax(self._logits, dim=0)
        n = len(self.levels)
        if self.epsilon == 0.0:
            coef = torch.ones(len(indices), dtype=torch.float64)
        else:  # (1−ε)q_a / ((1−ε)q_a + ε/n), written so that q_a = 0 gives 0, not 0/0
            q_a = q[indices]
            coef = (1.0 - self.epsilon) * q_a / ((1.0 - self.epsilon) * q_a + self.epsilon / n)
        one_hot = torch.nn.functional.one_hot(indices, n).to(torch.float64)
        return coef[:, None] * (one_hot - q[None, :])

    def update(self, levels, feedback) -> None:
        """One selector step from a batch of continuations (eq. 12), then the baseline (eq. 18).

        `feedback` W_j ∈ [0, 1] (eq. 7, Lemma B.1), one per level. An empty batch changes nothing (App. B.4).
        """
        weights = torch.as_tensor(feedback, dtype=torch.float64).reshape(-1)
        indices = self.level_indices(levels)
        if len(indices) != len(weights):
            raise ValueError(f"got {len(indices)} levels but {len(weights)} feedback values; need one per continuation")
        if len(weights) == 0:
            return
        if not bool(torch.isfinite(weights).all()) or bool(((weights < 0) | (weights > 1)).any()):
            raise ValueError(f"feedback must be finite values in [0, 1] (eq. 7), got {weights.tolist()}")
        direction = ((weights - self._baseline)[:, None] * self._score(indices)).sum(dim=0)
        self._logits = self._logits + self.lr * direction
        self._baseline = (1.0 - self.baseline_rate) * self._baseline + self.baseline_rate * float(weights.mean())
        self.num_updates += 1

    def state_dict(self) -> dict:
        """JSON-serialisable: levels, logits, baseline, update count and the sampler's generator state (ints)."""
        return {
            "levels": list(self.levels),
            "logits": self._logits.tolist(),
            "baseline": self._baseline,
            "num_updates": self.num_updates,
            "generator_state": self._generator.get_state().tolist(),
        }

    def load_state_dict(self, state: dict) -> None:
        missing = {"levels", "logits", "baseline", "generator_state"} - set(state)
        if missing:
            raise ValueError(f"selector state is missing {sorted(missing)}")
        if [float(level) for level in state["levels"]] != list(self.levels):
            raise ValueError(f"selector state has levels {state['levels']}, this selector has {list(self.levels)}")
        logits = torch.tensor(state["logits"], dtype=torch.float64)
        baseline = float(state["baseline"])
        if logits.shape != (len(self.levels),) or not bool(torch.isfinite(logits).all()):
            raise ValueError(f"selector state logits must be {len(self.levels)} finite numbers, got {state['logits']}")
        if not 0.0 <= baseline <= 1.0:
            raise ValueError(f"selector state baseline must lie in [0, 1], got {baseline}")
        self._generator.set_state(torch.tensor(state["generator_state"], dtype=torch.uint8))
        self._logits = logits
        self._baseline = baseline
        self.num_updates = int(state.get("num_updates", 0))


def mean_feedback_per_level(levels, feedback, all_levels: Sequence[float]) -> dict[float, float]:
    """Mean W per level for logging; NaN for a level with no continuation in this batch."""
    sums = {float(level): [0.0, 0] for level in all_levels}
    for level, weight in zip(levels, feedback, strict=True):
        if float(level) not in sums:
            raise ValueError(f"level {level} is not one of {list(all_levels)}")
        sums[float(level)][0] += float(weight)
        sums[float(level)][1] += 1
    return {level: (total / count if count else math.nan) for level, (total, count) in sums.items()}
