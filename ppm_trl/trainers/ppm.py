"""`PPMGRPOTrainer` under the module path it has always had; the trainer is `ppm_trl/ppm/ppm_trainer.py`."""

from ..ppm.ppm_trainer import PendingProgress, PPMGRPOTrainer

__all__ = ["PPMGRPOTrainer", "PendingProgress"]
