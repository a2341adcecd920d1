"""`JudgeStatsCallback`: judge calls, cache hits, failures, retries, latency and cost per logging step.

On every `on_log` it adds the judge's statistics since the previous log (per-step deltas; latency percentiles
over the calls finished in that window) to the `logs` dict, so they reach whatever `report_to` is set (wandb,
trackio, tensorboard, ...) and `state.log_history`.

Order matters: `Trainer` places callbacks passed as `callbacks=[...]` AFTER its reporting callbacks, which would
then log before this one adds its keys. Install it with `JudgeStatsCallback(judge).install(trainer)` (it puts
itself first), or pass it in `callbacks=` and call `install` on the trainer afterwards — `install` is idempotent.
"""

from __future__ import annotations

import math

from transformers import TrainerCallback

LOGGED = ("calls", "cache_hits", "failures", "retries", "unparseable", "prompt_tokens", "completion_tokens", "cost")


class JudgeStatsCallback(TrainerCallback):
    def __init__(self, judge, prefix: str = "judge/"):
        self.judge = judge
        self.prefix = prefix
        self._last = judge.stats.snapshot()

    def install(self, trainer) -> JudgeStatsCallback:
        """Make this the first callback of `trainer` so reporting callbacks see the judge metrics."""
        callbacks = trainer.callback_handler.callbacks
        if self in callbacks:
            callbacks.remove(self)
        callbacks.insert(0, self)
        return self

    def metrics(self) -> dict[str, float]:
        """The window's metrics (and start a new window)."""
        delta = self.judge.stats.since(self._last)
        self._last = self.judge.stats.snapshot()
        out = {f"{self.prefix}{name}": float(delta[name]) for name in LOGGED}
        for name in ("latency_p50", "latency_p95"):
            if not math.isnan(delta[name]):  # no call finished in this window: nothing to report, not 0
                out[f"{self.prefix}{name}"] = delta[name]
        return out

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None:
            return
        metrics = self.metrics()
        logs.update(metrics)
        # Trainer.log appended a copy of `logs` to the history just before calling us: complete that copy too.
        if state is not None and state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(metrics)
