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
  request of the step unscorable) raises `JudgeUnscorableError` — once the unscorable requests of the current run
  of such steps come from at least `judge_unscorable_min_rows` rows (a row counted once per step it fails in).
  A broken judge fails every row, and a full batch reaches that at once; one row the judge cannot score does not:
  it is quarantined instead (see `quarantine.py`: `judge_quarantine_after` unscorable attempts while the judge
  scores other rows), listed in `<output_dir>/quarantine.jsonl`, and its later requests are skipped (NaN scores,
  zero advantage, counted in `judge/quarantined`; `judge/quarantined_rows` is the list's length).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections import deque

from transformers import TrainerCallback

from .arguments import JudgeArguments
from .quarantine import (
    QUARANTINE_FILE,
    RowQuarantine,
    append_quarantine_records,
    install_quarantine,
    merge_attempts,
    read_quarantine_file,
)
from .settings import check_unscorable_settings

LOGGED = ("calls", "cache_hits", "failures", "retries", "unparseable", "prompt_tokens", "completion_tokens", "cost",
          "usage_unknown", "usage_clamped", "cache_rejected", "cache_write_failures", "quarantined", "throttled",
          "rate_limit_wait_s", "shared_across_processes")


class JudgeUnscorableError(RuntimeError):
    """Too many of the judge's requests were unscorable during training (see `judge_max_unscorable_frac`)."""


# The callback's own defaults are the training configs' (`JudgeArguments`).
_DEFAULTS = {spec.name: spec.default for spec in dataclasses.fields(JudgeArguments)}


class JudgeStatsCallback(TrainerCallback):
    def __init__(self, judge, prefix: str = "judge/",
                 max_unscorable_frac: float = _DEFAULTS["judge_max_unscorable_frac"],
                 unscorable_window: int = _DEFAULTS["judge_unscorable_window"],
                 unscorable_min_rows: int = _DEFAULTS["judge_unscorable_min_rows"],
                 quarantine_after: int = _DEFAULTS["judge_quarantine_after"]):
        self.judge = judge
        self.prefix = prefix
        self._last = judge.stats.snapshot()
        self._installed = False
        self.rows = None  # the QuarantiningJudge of the scorer, once installed with one
        self.output_dir = None
        self._configure(max_unscorable_frac, unscorable_window, unscorable_min_rows, quarantine_after)

    def _configure(self, max_unscorable_frac: float, unscorable_window: int, unscorable_min_rows: int,
                   quarantine_after: int) -> None:
        check_unscorable_settings(max_unscorable_frac, unscorable_window, unscorable_min_rows, quarantine_after)
        self.max_unscorable_frac = float(max_unscorable_frac)
        self.unscorable_min_rows = unscorable_min_rows
        self._window: deque[tuple[float, float]] = deque(maxlen=unscorable_window)  # (failed, asked) per step
        self._failing_rows = 0.0  # rows with unscorable requests, summed over the current run of failing steps
        self.quarantine = RowQuarantine(after=quarantine_after)
        self._step_start = self.judge.stats.snapshot()

    def install(self, trainer, scorer=None) -> JudgeStatsCallback:
        """Make this the first callback of `trainer` so reporting callbacks see the judge metrics; take the abort
        settings from `trainer.args` and probe the judge (both only on the first install). With the `scorer` that
        calls the judge, its rows can be quarantined (its judge is wrapped in a `QuarantiningJudge`)."""
        callbacks = trainer.callback_handler.callbacks
        if self in callbacks:
            callbacks.remove(self)
        if not self._installed:
            args = getattr(trainer, "args", None)
            self._configure(getattr(args, "judge_max_unscorable_frac", self.max_unscorable_frac),
                            getattr(args, "judge_unscorable_window", self._window.maxlen),
                            getattr(args, "judge_unscorable_min_rows", self.unscorable_min_rows),
                            getattr(args, "judge_quarantine_after", self.quarantine.after))
            self.output_dir = getattr(args, "output_dir", None)
            if getattr(args, "judge_probe", _DEFAULTS["judge_probe"]):
                self.judge.probe()
            self._installed = True
        if scorer is not None:
            self.rows = install_quarantine(scorer)
        callbacks.insert(0, self)
        return self

    def check_unscorable(self, step: int = 0, write: bool = False) -> list[dict]:
        """Close the step's window entry: quarantine rows (listed in `<output_dir>/quarantine.jsonl` when `write`;
        returns the new records) and raise `JudgeUnscorableError` when the window reaches the limit with enough
        failing rows. Under torch.distributed the counts and row records are combined over the processes first,
        so every process decides the same (one stopping alone would leave the others waiting in a collective)."""
        delta = self.judge.stats.since(self._step_start)
        self._step_start = self.judge.stats.snapshot()
        # unique items asked: API calls and cache hits (an answer too)
        failures, asked = summed_over_processes([delta["failures"], delta["calls"] + delta["cache_hits"]])
        last = getattr(self.judge, "last_failure", None)
        failing_rows = math.inf  # unknown rows (no QuarantiningJudge): every failing step counts in full
        new = []
        if self.rows is not None:
            attempts = merge_attempts(_gathered_over_processes(self.rows.take_attempts()))
            new = self.quarantine.update(attempts, step, None if last is None else str(last))
            self.rows.quarantined.update(record["key"] for record in new)
            if write and new and self.output_dir:
                os.makedirs(self.output_dir, exist_ok=True)
                append_quarantine_records(os.path.join(self.output_dir, QUARANTINE_FILE), new)
            if sum(failed for _, _, failed in attempts.values()) >= failures:  # every failure has its row
                failing_rows = sum(1 for _, _, failed in attempts.values() if failed)
        if asked == 0:
            return new  # no judge request this step (e.g. no correct response for PAPO): nothing to judge by
        self._window.append((failures, asked))
        failed = sum(f for f, _ in self._window)
        total = sum(a for _, a in self._window)
        if failed / total < self.max_unscorable_frac:
            self._failing_rows = 0.0
            return new
        self._failing_rows += failing_rows
        if self._failing_rows >= self.unscorable_min_rows:
            rows = "" if math.isinf(self._failing_rows) else f" from {self._failing_rows:g} rows"
            raise JudgeUnscorableError(
                f"{failed:g} of {total:g} judge requests were unscorable over the last {len(self._window)} step(s) "
                f"with judge requests{rows} (judge_max_unscorable_frac={self.max_unscorable_frac:g}, "
                f"judge_unscorable_window={self._window.maxlen}, judge_unscorable_min_rows="
                f"{self.unscorable_min_rows}); training stopped instead of continuing without "
                f"a judge signal. Judge: model {getattr(self.judge, 'model', '?')!r}, "
                f"api_base={getattr(self.judge, 'api_base', None)}. "
                f"Last failure: {last if last is not None else 'unknown'}"
            )
        return new

    def on_train_begin(self, args, state, control, **kwargs):
        """A resumed run keeps its quarantine (read back from its list); a new run starts a new list."""
        self.on_train_begin_totals()
        if self.rows is None or not self.output_dir:
            return
        path = os.path.join(self.output_dir, QUARANTINE_FILE)
        if state.global_step == 0:
            if state.is_world_process_zero and os.path.exists(path):
                os.remove(path)
            return
        for record in read_quarantine_file(path, repair=state.is_world_process_zero):
            self.quarantine.quarantined[record["key"]] = record
            self.rows.quarantined.add(record["key"])

    def on_step_end(self, args, state, control, **kwargs):
        self.check_unscorable(step=getattr(state, "global_step", 0),
                              write=getattr(state, "is_world_process_zero", False))

    def metrics(self) -> dict[str, float]:
        """The window's metrics (and start a new window)."""
        delta = self.judge.stats.since(self._last)
        self._last = self.judge.stats.snapshot()
        out = {f"{self.prefix}{name}": float(delta[name]) for name in LOGGED}
        if self.rows is not None:
            out[f"{self.prefix}quarantined_rows"] = float(len(self.quarantine.quarantined))
        for name in ("latency_p50", "latency_p95"):
            if not math.isnan(delta[name]):  # no call finished in this window: nothing to report, not 0
                out[f"{self.prefix}{name}"] = delta[name]
        return out

    def on_train_begin_totals(self) -> None:
        self._run_start = self.judge.stats.snapshot()

    def run_totals(self) -> dict[str, float]:
        """Every counter summed over the run so far (since `on_train_begin`): what `train().metrics` reports."""
        delta = self.judge.stats.since(getattr(self, "_run_start", None) or self.judge.stats.snapshot())
        return {f"{self.prefix}{name}": float(delta[name]) for name in LOGGED}

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None:
            return
        if "train_runtime" in logs:  # TRL's end-of-training entry (train().metrics): the run's totals, not a window
            logs.update(self.run_totals())
            if state is not None and state.log_history and "train_runtime" in state.log_history[-1]:
                state.log_history[-1].update(self.run_totals())
            return
        metrics = self.metrics()
        logs.update(metrics)
        # Trainer.log appended a copy of `logs` to the history just before calling us: complete that copy too.
        if state is not None and state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(metrics)


def summed_over_processes(values: list[float]) -> list[float]:
    """`values` summed element-wise over the torch.distributed processes (unchanged in a single process)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return list(values)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    totals = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(totals)
    return totals.tolist()


def _gathered_over_processes(obj) -> list:
    """[obj of every torch.distributed process] ([obj] in a single process)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, obj)
    return everyone
