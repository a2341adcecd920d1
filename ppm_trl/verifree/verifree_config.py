"""`VerifreeConfig`: the `GRPOConfig` of [`VerifreeTrainer`] — the PPM paper's VeriFree baseline (App. B.1, eq. 110)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from ..configs import WholeGroupBatches


@dataclass
class VerifreeConfig(WholeGroupBatches, GRPOConfig):
    r"""Configuration of [`VerifreeTrainer`]: reward = outcome + `verifree_weight` · exp(mean log π(x^ref | x̃)).

    The PPM paper trains VeriFree "on outcome reward plus the method reward" (App. B.1); `verifree_weight: 0` leaves
    GRPO. The likelihood is read under the current policy with no gradient through it (it is a reward here, as the
    issue and the paper's eq. 110 read as a reward; the original VeriFree also back-propagates through it).
    """

    verifree_weight: float = field(
        default=1.0, metadata={"help": "Weight of the reference-answer likelihood reward added to the outcome."})
    verifree_batch_size: int = field(
        default=8, metadata={"help": "Rows per forward pass when reading the likelihood (memory, not results)."})

    def __post_init__(self):
        super().__post_init__()
        if self.verifree_batch_size < 1:
            raise ValueError(f"verifree_batch_size must be >= 1, got {self.verifree_batch_size}")
