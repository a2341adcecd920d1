"""The composed trainers under the module path they have always had; they are `ppm_trl/composed.py`'s."""

from ..composed import PAPOARGTrainer, PPMARGTrainer

__all__ = ["PAPOARGTrainer", "PPMARGTrainer"]
