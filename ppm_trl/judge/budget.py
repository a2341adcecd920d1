"""`JudgeBudgetCallback`: stop training once the judge's budget (`judge_max_cost_usd` / `judge_max_total_tokens`)
is spent, summed over the training processes.

The check runs at the end of each optimizer step, so the step that crosses the budget finishes (its judge answers
are paid for and used) and nothing stops in the middle of a write; when saving is on, that step is checkpointed
(`control.should_save`), so `--resume_from_checkpoint` continues with a larger budget. Every process sees the same
sums (all-reduced), so all stop at the same step.
"""

from __future__ import annotations

import logging

from transformers import TrainerCallback

from ppm_trl.judge.callback import summed_over_processes

logger = logging.getLogger(__name__)


class JudgeBudgetCallback(TrainerCallback):
    """Ends training after the step in which the judge's spending reached its budget (and saves that step)."""

    def __init__(self, judge):
        self.judge = judge
        self.stopped: str | None = None  # why training was stopped, once it was

    def on_train_begin(self, args, state, control, **kwargs):
        """A cost budget on a model LiteLLM cannot price could never be counted: said before step 1 (it used to
        stop the run after it, once the first answers came back unpriced)."""
        if getattr(self.judge, "max_cost_usd", None) is None:
            return
        from ppm_trl.judge.transport import _Pricing

        model = getattr(self.judge, "model", "?")
        if _Pricing(model).cost(1000, 100) is None:
            raise ValueError(f"judge_max_cost_usd={self.judge.max_cost_usd:g} is set, but LiteLLM's price table has no "
                             f"price for the judge model {model!r}, so no answer could be counted against it. Remove "
                             "judge_max_cost_usd, or budget the judge's tokens with judge_max_total_tokens")

    def on_step_end(self, args, state, control, **kwargs):
        spent = self.judge.spent()
        cost_usd, tokens, unpriced, usage_unknown = summed_over_processes(
            [spent["cost_usd"], spent["tokens"], spent["unpriced"], spent["usage_unknown"]])
        reason = self.judge.budget_exhausted(cost_usd=cost_usd, tokens=tokens, unpriced=unpriced,
                                             usage_unknown=usage_unknown)
        if reason is None or self.stopped is not None:
            return control
        saving = getattr(args, "save_strategy", "no") != "no"  # SaveStrategy is a str enum
        self.stopped = (f"judge budget spent at step {state.global_step}: {reason}. Training stopped after this step"
                        + (f"; a checkpoint is saved in {args.output_dir}, resume it with a larger budget "
                           "(--resume_from_checkpoint)" if saving else " (saving is off: no checkpoint)"))
        control.should_training_stop = True
        if saving:
            control.should_save = True
        if state.is_world_process_zero:
            logger.warning(self.stopped)
        return control
