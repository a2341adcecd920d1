"""`MethodTrainer`: GRPOTrainer with public hooks for a method's rollouts, scores, advantages and checkpoint state.

It is the seam's parts put together — the hooks (`hooks.py`), generation through the trainer's own backend
(`generation.py`), training with resume and clean stops (`preemption.py`), the model card (`model_card.py`) and Hub
uploads (`hub.py`) — plus what a method trainer reads of TRL's state, by name (`outcome_reward_weights`, `eos_ids`,
`masks_truncated_completions`, ...). `MethodTrainer.__init__` checks the reward functions' dataset columns and
resolves the model path ("tiny", a local directory made absolute) once per trainer, however many method classes a
composed trainer's MRO runs; each method's `__init__` checks only its own columns and config.
"""

from __future__ import annotations

import inspect
import json
import sys

import torch
from transformers import TrainerCallback
from trl import GRPOTrainer
from trl.trainer.utils import get_config_model_id

from ...advantages import process_share
from ..common import check_reward_columns, resolve_model_path
from .generation import GenerationHelpers
from .hooks import MethodHooks, Rollout
from .hub import HubUploads
from .model_card import ModelCardWriter
from .preemption import Preemption


class RunReport(TrainerCallback):
    """When `train` ends (not stopped by a signal), on the main process: `ppm_trl: done {summary}` on stdout — steps,
    loss, output dir, step times, the mean of the method's metrics (`ppm_trl.report.training_summary`) — and, when
    no gradient reached the model, `ppm_trl: warning: nothing was learned: <why>` on stderr (the rule `ppm-trl train`
    uses, `ppm_trl.report.nothing_learned`). `trainer.remove_callback(RunReport)` silences both."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_train_end(self, args, state, control, **kwargs):
        trainer = self.trainer
        if trainer._sigterm_received or not state.is_world_process_zero:  # a stop says so itself
            return
        from ...registry import method_of_trainer
        from ...report import nothing_learned_this_run, training_summary

        method = method_of_trainer(type(trainer))
        summary = training_summary(trainer, None, method.name if method else type(trainer).__name__)
        print("ppm_trl: done " + json.dumps(summary), flush=True)
        problem = nothing_learned_this_run(trainer)
        if problem:
            print(f"ppm_trl: warning: nothing was learned: {problem}", file=sys.stderr, flush=True)


class MethodTrainer(MethodHooks, GenerationHelpers, Preemption, ModelCardWriter, HubUploads, GRPOTrainer):
    """GRPOTrainer with public hooks for a method's rollouts, scores, advantages and checkpoint state."""

    def __init__(self, model, reward_funcs=None, args=None, train_dataset=None, **kwargs):
        # TRL reads `_name`, `_paper` and `_tag_names` for the model card (and the tags in __init__): the method's
        # registry record says them (`ppm_trl.methods.Method.model_card`), unless a subclass of the registered
        # trainer sets its own.
        from ...registry import method_of_trainer
        from ..common import registered_model_card

        if any("on_scores" in vars(k) for k in type(self).__mro__):
            raise TypeError(f"{type(self).__name__}.on_scores: this hook is gone; read what it received from the "
                            "ScoredBatch that `compute_advantages(batch)` gets (rows, completions, gathered rewards "
                            "and outcome, masks, this process's slice, the pending work of `on_final_rollout`)")
        try:
            inspect.signature(self.compute_advantages).bind(None)
        except TypeError:
            raise TypeError(f"{type(self).__name__}.compute_advantages must take one argument, the ScoredBatch "
                            "(`compute_advantages(self, batch)`); the masks are `batch.completion_mask` and "
                            "`batch.tool_mask`") from None
        for attribute, value in registered_model_card(type(self)).items():
            setattr(self, attribute, value)
        # Once per trainer, however many method classes its MRO composes.
        method = method_of_trainer(type(self))
        check_reward_columns(train_dataset, reward_funcs, method.name.upper() if method else type(self).__name__)
        if args is None:
            args = self.default_config(model)
        model = resolve_model_path(model, args)  # "tiny", or a local directory made absolute
        super().__init__(model, reward_funcs, args=args, train_dataset=train_dataset, **kwargs)
        self.add_callback(RunReport(self))

    @classmethod
    def default_config(cls, model):
        """The method's config with its defaults, for a trainer built without `args` — as GRPOTrainer builds
        `GRPOConfig("<model name>-GRPO")`: output_dir `<model name>-<METHOD>` (`Qwen3-1.7B-PPM`, `tiny-PPM-ARG`).
        One departure, as `ppm-trl train` makes it: bf16 only where a GPU supports it (TRL's default, bf16 on,
        refuses to build on a CPU)."""
        from ...registry import method_of_trainer

        method = method_of_trainer(cls)
        if method is None:
            raise ValueError(f"{cls.__name__} is no registered method's trainer: pass its config as `args`")
        name = model if isinstance(model, str) else get_config_model_id(model.config)
        name = str(name).rstrip("/").split("/")[-1]
        bf16 = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        return method.config_class()(output_dir=f"{name}-{method.name.upper().replace('+', '-')}", bf16=bf16)

    def method_scorers(self) -> list:
        """The scorers the method calls for partial credit (PPM's progress scorer, PAPO's process scorer; none by
        default): the model card names the judge behind the first that has one."""
        return []

    # ---------------------------------------------------------------------------------------- public helpers
    @property
    def tokenizer(self):
        """The text tokenizer (the processor's own for a multimodal processor)."""
        return self._tokenizer

    @property
    def is_multimodal(self) -> bool:
        return self._is_vlm

    @property
    def outcome_reward_weights(self) -> torch.Tensor:
        """(F,) weight of each reward function, in `reward_funcs` order: `args.reward_weights`, or all 1 (TRL's own
        tensor, which also covers a reward function TRL appends itself)."""
        return self.reward_weights

    @property
    def eos_ids(self) -> list[int]:
        """The ids that end a completion: the generation config's EOS ids and the tokenizer's (TRL's union)."""
        return list(self.eos_token_ids)

    @property
    def masks_truncated_completions(self) -> bool:
        """Whether completions not ended by an EOS (or pad) id are removed from the loss (TRL's
        `mask_truncated_completions`)."""
        return bool(self.mask_truncated_completions)

    def prepare_frozen_model(self, model):
        """A model that never trains (OPSD's fixed teacher), placed as TRL places its reference model: frozen, in eval
        mode, DeepSpeed-prepared under DeepSpeed (ZeRO-3 shards it like the policy), else Accelerate's eval-mode
        prepare."""
        model.requires_grad_(False)
        model.eval()
        if getattr(self.accelerator.state, "deepspeed_plugin", None) is not None:
            from trl.models import prepare_deepspeed

            return prepare_deepspeed(model, self.accelerator)
        return self.accelerator.prepare_model(model, evaluation_mode=True)

    def local_rows(self, num_local_rows: int) -> slice:
        """This process's rows within the gathered batch (every process holds `num_local_rows`, in rank order)."""
        return process_share(self.accelerator.process_index, num_local_rows)

    @property
    def current_rollout(self) -> Rollout | None:
        """The rollout of the generation batch being scored (None outside `_generate_and_score_completions`)."""
        return self._current_rollout
