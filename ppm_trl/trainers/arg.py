"""`ARGTrainer` under the module path it has always had; the trainer is `ppm_trl/arg/arg_trainer.py`."""

from ..arg.arg_trainer import SELECTOR_STATE_FILE, ARGTrainer

__all__ = ["ARGTrainer", "SELECTOR_STATE_FILE"]
