"""What a run will ask of its judge, projected before it starts: pure arithmetic (no I/O, no TRL, no LiteLLM).

`ppm-trl estimate` (`ppm_trl/estimate/`) measures or assumes the per-unit figures — judge requests per rollout
(or per `prepare` row), prompt and completion tokens per request, the latency of one request, LiteLLM's prices —
and this module scales them to a generation batch, an optimizer step and the whole run, and bounds the judge's
wall time by the configured limits.

TRL's schedule (TRL 1.16 `GRPOTrainer`, transformers' `Trainer`), with P processes, b = per_device_train_batch_size,
A = gradient_accumulation_steps, S = steps_per_generation (default A), μ = num_iterations, G = num_generations:

    generation batch          B = b × P × S completions, B / G prompts, generated once every S × μ micro-steps
    generation batches         n_gen = ceil(steps × A / (S × μ))             (one per optimizer step by default)
    steps of one epoch         ceil(floor(N / (B / G)) × S × μ / A)          (N dataset rows; TRL's RepeatSampler)
    steps of a run             max_steps, or ceil(num_train_epochs × steps of one epoch) when max_steps <= 0

Judge work of one generation batch, from the mean figures of one unit (a rollout, or a `prepare` row):

    requests                   R = units × requests_per_unit × (1 − duplicate_fraction)
    prompt / completion tokens R × prompt_tokens, R × completion_tokens (means per request)
    cost                       prompt tokens × USD per prompt token + completion tokens × USD per completion token
                               (None: the judge model has no price)

Its wall time is the slowest of three bounds (a bound whose limit is not set is 0):

    requests per minute        R / max_rpm × 60 s
    tokens per minute          (prompt + completion tokens) / max_tpm × 60 s
    concurrency × latency      ceil((R / P) / max(1, max_concurrency // P)) × latency   (each process takes 1/P of
                               the run's concurrency and judges 1/P of the batch; waves of requests one latency each)

A step's and a run's figures are the batch's times the batches per step (A / (S × μ)) and the batches of the run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class RequestProfile:
    """Mean judge work of one unit: a rollout (training) or a distinct row (`prepare`)."""

    requests_per_unit: float
    prompt_tokens: float  # per request
    completion_tokens: float  # per request


@dataclass(frozen=True)
class JudgeLimits:
    """The run's judge limits (None: unlimited) and the latency of one request, in seconds."""

    max_rpm: float | None
    max_tpm: float | None
    max_concurrency: int
    latency_s: float
    processes: int = 1


@dataclass(frozen=True)
class Prices:
    """LiteLLM's price of one token (USD); `Prices(None, None)` is an unpriced model."""

    prompt_usd: float | None
    completion_usd: float | None

    @property
    def known(self) -> bool:
        return self.prompt_usd is not None and self.completion_usd is not None


@dataclass(frozen=True)
class Workload:
    """Requests, tokens, cost and the three wall-time bounds (seconds) of some judge work."""

    requests: float
    prompt_tokens: float
    completion_tokens: float
    cost_usd: float | None
    seconds_rpm: float
    seconds_tpm: float
    seconds_concurrency: float

    @property
    def seconds(self) -> float:
        """The projection: the slowest bound."""
        return max(self.seconds_rpm, self.seconds_tpm, self.seconds_concurrency)

    @property
    def total_tokens(self) -> float:
        return self.prompt_tokens + self.completion_tokens

    def scaled(self, factor: float) -> Workload:
        """`factor` of these batches, one after the other (every figure, the times included, × factor)."""
        return Workload(self.requests * factor, self.prompt_tokens * factor, self.completion_tokens * factor,
                        None if self.cost_usd is None else self.cost_usd * factor, self.seconds_rpm * factor,
                        self.seconds_tpm * factor, self.seconds_concurrency * factor)

    def to_dict(self) -> dict:
        return {**asdict(self), "seconds": self.seconds, "total_tokens": self.total_tokens}


def steps_per_generation(gradient_accumulation_steps: int, per_device_batch: int, processes: int,
                         given_steps_per_generation: int | None = None,
                         given_generation_batch_size: int | None = None) -> int:
    """S: the user's `steps_per_generation`, or `generation_batch_size / (b × P)`, or (TRL's default) A."""
    if given_steps_per_generation is not None:
        return given_steps_per_generation
    if given_generation_batch_size is not None:
        return max(given_generation_batch_size // (per_device_batch * processes), 1)
    return gradient_accumulation_steps


def generation_batch_size(per_device_batch: int, processes: int, steps_per_generation: int) -> int:
    """B = b × P × S completions generated (and judged) at once."""
    return per_device_batch * processes * steps_per_generation


def steps_per_epoch(rows: int, num_generations: int, batch: int, steps_per_generation: int, num_iterations: int,
                    gradient_accumulation_steps: int) -> int:
    """ceil(floor(N / (B / G)) × S × μ / A), at least 1: TRL's RepeatSampler yields whole generation batches of
    B / G prompts, each S × μ times (one micro-step each), and transformers counts A micro-steps a step."""
    prompts = max(batch // num_generations, 1)
    micro_steps = (rows // prompts) * steps_per_generation * num_iterations
    return max(math.ceil(micro_steps / gradient_accumulation_steps), 1)


def run_steps(max_steps: int, num_train_epochs: float, epoch_steps: int) -> int:
    """`max_steps` when > 0, else ceil(num_train_epochs × steps of one epoch) (transformers' rule)."""
    return max_steps if max_steps > 0 else math.ceil(num_train_epochs * epoch_steps)


def generation_batches(steps: int, gradient_accumulation_steps: int, steps_per_generation: int,
                       num_iterations: int) -> int:
    """n_gen = ceil(steps × A / (S × μ)): TRL generates at every S × μ-th micro-step."""
    return math.ceil(steps * gradient_accumulation_steps / (steps_per_generation * num_iterations))


def batches_per_step(gradient_accumulation_steps: int, steps_per_generation: int, num_iterations: int) -> float:
    """A / (S × μ) generation batches an optimizer step (on average, when it is not a whole number)."""
    return gradient_accumulation_steps / (steps_per_generation * num_iterations)


def requests_of(units: float, requests_per_unit: float, duplicate_fraction: float = 0.0) -> float:
    """R = units × requests_per_unit × (1 − duplicate_fraction): identical requests (the judge's cache and its
    in-flight de-duplication answer them once) are counted once."""
    if not 0.0 <= duplicate_fraction < 1.0:
        raise ValueError(f"duplicate_fraction must lie in [0, 1), got {duplicate_fraction!r}")
    return units * requests_per_unit * (1.0 - duplicate_fraction)


def seconds_at_rate(amount: float, per_minute: float | None) -> float:
    """amount / per_minute × 60 seconds; 0 without a limit."""
    return 0.0 if per_minute is None else amount / per_minute * 60.0


def seconds_at_concurrency(requests: float, max_concurrency: int, latency_s: float, processes: int = 1) -> float:
    """ceil((R / P) / max(1, max_concurrency // P)) × latency: each process sends its 1/P of the batch in waves of
    its share of the concurrency (the judge client's split), each wave one request's latency."""
    if requests <= 0:
        return 0.0
    per_process = max(max_concurrency // processes, 1)
    return math.ceil(requests / processes / per_process - 1e-9) * latency_s


def batch_workload(units: float, profile: RequestProfile, limits: JudgeLimits, prices: Prices,
                   duplicate_fraction: float = 0.0, chained: int = 1) -> Workload:
    """The judge work of one batch of `units` (rollouts or rows) sent together (see the module doc). `chained`: the
    requests of a unit that wait for each other (prepare's graph request needs the points answer), so however
    high the concurrency the batch takes at least that many latencies."""
    requests = requests_of(units, profile.requests_per_unit, duplicate_fraction)
    prompt, completion = requests * profile.prompt_tokens, requests * profile.completion_tokens
    cost = prompt * prices.prompt_usd + completion * prices.completion_usd if prices.known else None
    waves = seconds_at_concurrency(requests, limits.max_concurrency, limits.latency_s, limits.processes)
    return Workload(requests, prompt, completion, cost, seconds_at_rate(requests, limits.max_rpm),
                    seconds_at_rate(prompt + completion, limits.max_tpm),
                    max(waves, chained * limits.latency_s) if requests > 0 else 0.0)


def steps_within_budget(per_step: float, budget: float | None) -> float | None:
    """How many steps a budget (USD or tokens) lasts at `per_step` a step; None without a budget or spending."""
    if budget is None or per_step <= 0:
        return None
    return budget / per_step


def calibration_order(requests_per_unit: Sequence[int]) -> list[tuple[int, int]]:
    """(unit, request position) pairs for `--calibrate`: round d takes position (unit + d) mod n_unit of every unit
    that has more than d requests, so the first N pairs spread over the units and over the positions within a unit
    (PPM's short and long prefixes alike), and no pair comes twice."""
    order = []
    for d in range(max(requests_per_unit, default=0)):
        order += [(unit, (unit + d) % count) for unit, count in enumerate(requests_per_unit) if d < count]
    return order


def format_seconds(seconds: float) -> str:
    """`0 s`, `42 s`, `3 min 05 s`, `2 h 07 min`, `3 d 04 h`."""
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 or seconds == 0 else f"{seconds:.1f} s"
    minutes, second = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {second:02d} s"
    hours, minute = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minute:02d} min"
    days, hour = divmod(hours, 24)
    return f"{days} d {hour:02d} h"
