"""`PAPOTrainer` under the module path it has always had; the trainer is `ppm_trl/papo/papo_trainer.py`."""

from ..papo.papo_trainer import PAPOTrainer, PendingProcessScores

__all__ = ["PAPOTrainer", "PendingProcessScores"]
