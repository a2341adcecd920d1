"""`OPSDConfig`: the `GRPOConfig` of [`OPSDTrainer`] — the PPM paper's OPSD baseline (App. B.1, eq. 111)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from ..configs import WholeGroupBatches

TEACHER_TEMPLATE = ("{problem}\n\nHere is a reference solution to this problem:\n{reference}\n\n"
                    "After reading the reference solution, solve the problem yourself.")


@dataclass
class OPSDConfig(WholeGroupBatches, GRPOConfig):
    r"""Configuration of [`OPSDTrainer`]: on-policy self-distillation from a fixed teacher, the starting policy given
    the reference solution as privileged context. The policy-gradient fields of `GRPOConfig` (rewards, advantages,
    clipping) do not enter the loss; the rewards are still computed and logged. No group filtering (App. B.1). The
    terms TRL adds to its policy-gradient loss — the KL penalty (`beta`) and the entropy bonus (`entropy_coef`,
    `use_adaptive_entropy`) — are refused rather than dropped: eq. 111's JSD replaces that loss.
    """

    opsd_beta: float = field(
        default=0.5, metadata={"help": "β of the generalized JSD between teacher and student (0.5: eq. 111's JSD)."})
    opsd_teacher_template: str = field(
        default=TEACHER_TEMPLATE,
        metadata={"help": "The teacher's user turn: a format string with {problem} and {reference} (the privileged "
                  "context); the completion follows it as it follows the student's prompt."})

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 < self.opsd_beta < 1.0:
            raise ValueError(f"opsd_beta must be in (0, 1), got {self.opsd_beta}")
        added = [f"`{name}={value}`" for name, value in (("beta", self.beta), ("entropy_coef", self.entropy_coef),
                                                           ("use_adaptive_entropy", self.use_adaptive_entropy)) if value]
        if added:
            raise ValueError(f"OPSD trains on eq. 111's JSD alone, which replaces TRL's policy-gradient loss; "
                             f"{', '.join(added)} adds a term to that loss and would be ignored. Leave `beta=0.0`, "
                             "`entropy_coef=0.0` and `use_adaptive_entropy=False` (the defaults)")
        missing = [name for name in ("{problem}", "{reference}") if name not in self.opsd_teacher_template]
        if missing:
            raise ValueError(f"opsd_teacher_template must contain {missing}: the teacher sees the problem and the "
                             "reference solution")
