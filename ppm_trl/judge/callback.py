"""`JudgeStatsCallback`: judge calls, cache hits, failures, retries, latency and cost per logging step.

On every `on_log` it adds the judge's statistics since the previous log (per-step deltas; latency percentiles
over the calls finished in that window) to the `logs` dict, so they reach whatever `report_to` is set (wandb,
trackio, tensorboard, ...) and `state.log_history`.

Order matters: `Trainer` places callbacks passed as `callbacks=[...]` AFTER its reporting callbacks, which would
then log before this one adds its keys. Install it with `JudgeStatsCallback(judge).install(trainer)` (it puts
itself first), or pass it in `callbacks=` and call `install` on the trainer afterwards — `install` is idempotent.

A judge that cannot judge stops the run instead of training on zero process reward:
* `install` probes the judge once (`LiteLLMJudge.probe`, unless `judge_probe=False` in the trainer's args): a
  refused/missing key, an unknown model or URL, or nothing listening at `api_base` raises
  `JudgeConfigurationError` at trainer construction;
* after every optimizer step that sent judge requests, the unscorable fraction over the last
  `judge_unscorable_window` such steps is checked; reaching `judge_max_unscorable_frac` (default 1.0: every
  request of the step unscorable) raises `JudgeUnscorableError`.
"""

from __future__ import annotations

import math
from collections import deque

from transformers import TrainerCallback

LOGGED = ("calls", "cache_hits", "failures", "retries", "unparseable", "prompt_tokens", "completion_tokens", "cost",
          "usage_unknown", "cache_rejected", "cache_write_failures", "quarantined")


class JudgeUnscorableError(RuntimeError):
    """Too many of the judge's requests were unscorable during training (see `judge_max_unscorable_frac`)."""


def check_unscorable_settings(max_unscorable_frac: float, unscorable_window: int) -> None:
    """Refuse abort settings that would never (or always) stop a run."""
    if isinstance(max_unscorable_frac, bool) or not isinstance(max_unscorable_frac, (int, float)) \
            or not 0.0 < max_unscorable_frac <= 1.0:
        raise ValueError(f"judge_max_unscorable_frac must be in (0, 1], got {max_unscorable_frac!r}")
    if isinstance(unscorable_window, bool) or not isinstance(unscorable_window, int) or unscorable_window < 1:
        raise ValueError(f"judge_unscorable_window must be an integer >= 1, got {unscorable_window!r}")


class JudgeStatsCallback(TrainerCallback):
    def __init__(self, judge, prefix: str = "judge/", max_unscorable_frac: float = 1.0, unscorable_window: int = 1):
        self.judge = judge
        self.prefix = prefix
        self._last = judge.stats.snapshot()
        self._installed = False
        self._configure(max_unscorable_frac, unscorable_window)

    def _configure(self, max_unscorable_frac: float, unscorable_window: int) -> None:
        check_unscorable_settings(max_unscorable_frac, unscorable_window)
        self.max_unscorable_frac = float(max_unscorable_frac)
        self._window: deque[tuple[float, float]] = deque(maxlen=unscorable_window)  # (failed, asked) per step
        self._step_start = self.judge.stats.snapshot()

    def install(self, trainer) -> JudgeStatsCallback:
        """Make this the first callback of `trainer` so reporting callbacks see the judge metrics; take the abort
        settings from `trainer.args` and probe the judge (both only on the first install)."""
        callbacks = trainer.callback_handler.callbacks
        if self in callbacks:
            callbacks.remove(self)
        if not self._installed:
            args = getattr(trainer, "args", None)
            self._configure(getattr(args, "judge_max_unscorable_frac", self.max_unscorable_frac),
                            getattr(args, "judge_unscorable_window", self._window.maxlen))
            if getattr(args, "judge_probe", True):
                self.judge.probe()
            self._installed = True
        callbacks.insert(0, self)
        return self

    def check_unscorable(self) -> None:
        """Close the step's window entry; raise `JudgeUnscorableError` when the window reaches the limit. Under
        torch.distributed the counts are summed over the processes first, so every process stops together (one
        stopping alone would leave the others waiting in their next collective)."""
        delta = self.judge.stats.since(self._step_start)
        self._step_start = self.judge.stats.snapshot()
        # unique items asked: API calls and cache hits (an answer too)
        failures, asked = _summed_over_processes(delta["failures"], delta["calls"] + delta["cache_hits"])
        if asked == 0:
            return  # no judge request this step (e.g. no correct response for PAPO): nothing to judge by
        self._window.append((failures, asked))
        failed = sum(f for f, _ in self._window)
        total = sum(a for _, a in self._window)
        if failed / total >= self.max_unscorable_frac:
            last = getattr(self.judge, "last_failure", None)
            raise JudgeUnscorableError(
                f"{failed:g} of {total:g} judge requests were unscorable over the last {len(self._window)} step(s) "
                f"with judge requests (judge_max_unscorable_frac={self.max_unscorable_frac:g}, "
                f"judge_unscorable_window={self._window.maxlen}); training stopped instead of continuing without "
                f"a judge signal. Judge: model {getattr(self.judge, 'model', '?')!r}, "
                f"api_base={getattr(self.judge, 'api_base', None)}. "
                f"Last failure: {last if last is not None else 'unknown'}"
            )

    def on_step_end(self, args, state, control, **kwargs):
        self.check_unscorable()

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


def _summed_over_processes(failures: float, asked: float) -> tuple[float, float]:
    """(failures, asked) summed over the torch.distributed processes (as they are in a single process)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return failures, asked
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    totals = torch.tensor([failures, asked], dtype=torch.float64, device=device)
    dist.all_reduce(totals)
    return float(totals[0]), float(totals[1])
