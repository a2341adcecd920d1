"""What one request costs, measured without sending it: a judge that records the requests a scorer (or `prepare`)
would send, their prompt tokens (LiteLLM's `token_counter`), LiteLLM's prices, and — with `--calibrate N` — N of
them sent through the run's judge client to measure tokens and latency."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from ppm_trl.flags import UsageError
from ppm_trl.judge import projection
from ppm_trl.judge.limits import prompt_tokens_estimate
from ppm_trl.judge.stats import JudgeStats
from ppm_trl.judge.tasks import JudgeTasks, with_nonce

Messages = list[dict[str, str]]


class RecordingJudge(JudgeTasks):
    """The judge task API (the same prompts and skips as `LiteLLMJudge`) that records each request's messages and
    answers none of them (None: unscorable, which no estimate reads)."""

    def __init__(self):
        self.stats = JudgeStats()
        self.requests: list[Messages] = []

    def _batch(self, jobs, explain: bool = False):
        self.requests.extend(messages for messages, _ in jobs)
        return [None] * len(jobs)

    async def _abatch(self, jobs, explain: bool = False):
        return self._batch(jobs, explain)

    def take(self) -> list[Messages]:
        requests, self.requests = self.requests, []
        return requests


@dataclass
class Sample:
    """The requests of one unit (a stand-in rollout, or a `prepare` row) and their local token counts."""

    requests: list[Messages]
    tokens: list[int] = field(default_factory=list)


def count_samples(samples: list[Sample], count: Callable[[Messages], int], echo_nonce: bool) -> None:
    """Fill each sample's token counts; with `echo_nonce` the client adds its nonce line, so it is counted too."""
    for sample in samples:
        sample.tokens = [count(with_nonce(m, str)[0] if echo_nonce else m) for m in sample.requests]


def judge_token_counter(model: str) -> tuple[Callable[[Messages], int], str]:
    """(count(messages) -> prompt tokens, what counts them): LiteLLM's `token_counter` when it runs offline for
    this model, else ~4 characters a token (`limits.prompt_tokens_estimate`, what the client reserves for tpm)."""
    try:
        from ppm_trl.judge.transport import import_litellm

        litellm = import_litellm()
        probe = [{"role": "user", "content": "2 + 2 = 4"}]
        litellm.token_counter(model=model, messages=probe)
    except Exception as error:  # noqa: BLE001 - any failure means: count characters instead
        return prompt_tokens_estimate, (f"~4 characters a token (LiteLLM's token_counter failed: "
                                        f"{type(error).__name__}: {str(error)[:120]})")
    logger = logging.getLogger("LiteLLM")

    def count(messages: Messages) -> int:
        level = logger.level
        logger.setLevel(logging.ERROR)  # its "falling back to tiktoken" warning would come once a request
        try:
            return int(litellm.token_counter(model=model, messages=messages))
        finally:
            logger.setLevel(level)

    return count, (f"LiteLLM's token_counter for {model} (its tokenizer for the model; tiktoken cl100k_base when it "
                   "has none)")


def judge_prices(model: str, prompt_tokens: float, completion_tokens: float) -> tuple[projection.Prices, str]:
    """LiteLLM's price of one prompt and one answer token of `model`, at this request size (prices can depend on
    the context length); unpriced when LiteLLM has none (a local server)."""
    prompt, completion = max(round(prompt_tokens), 1), max(round(completion_tokens), 1)
    try:
        from ppm_trl.judge.transport import checked_cost, import_litellm

        prompt_usd, completion_usd = import_litellm().cost_per_token(model=model, prompt_tokens=prompt,
                                                                     completion_tokens=completion)
    except Exception:  # noqa: BLE001 - LiteLLM raises for a model it has no price for
        return projection.Prices(None, None), f"unpriced: LiteLLM's price table has no price for {model!r}"
    prompt_usd, completion_usd = checked_cost(prompt_usd), checked_cost(completion_usd)
    if prompt_usd is None or completion_usd is None:  # NaN, infinite or negative: a price table not to believe
        return projection.Prices(None, None), (f"unpriced: LiteLLM's price table gives {model!r} a price that is not "
                                               "a finite amount >= 0")
    return (projection.Prices(prompt_usd / prompt, completion_usd / completion),
            f"LiteLLM's price table for {model}")


# ----------------------------------------------------------------------------------------- calibration
@dataclass(frozen=True)
class Calibration:
    """What N real requests measured: tokens per answered request (None: the server reported no usage), the
    ratio of the judge's prompt count to the local count, and the median latency."""

    sent: int
    answered: int
    prompt_ratio: float | None
    completion_tokens: float | None
    latency_s: float
    failures: int

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def calibrate(judge, samples: list[Sample], count: int) -> Calibration:
    """Send `count` of the samples' requests through `judge` (a `LiteLLMJudge` without cache: every one is sent)
    and measure them; `projection.calibration_order` picks them across units and request positions."""
    order = projection.calibration_order([len(s.requests) for s in samples])[:count]
    chosen = [samples[unit].requests[position] for unit, position in order]
    local = [samples[unit].tokens[position] for unit, position in order]
    try:
        judge.complete(chosen)
    finally:
        judge.close()
    stats = judge.stats.snapshot()
    answered = int(stats["calls"] - stats["failures"])
    if answered == 0:
        raise UsageError(f"--calibrate: the judge answered none of the {len(chosen)} requests"
                         + (f" ({judge.last_failure})" if judge.last_failure else ""))
    replies_with_usage = answered + stats["unparseable"] - stats["usage_unknown"]
    prompt_ratio = completion = None
    if replies_with_usage > 0 and stats["prompt_tokens"] > 0:
        prompt_ratio = stats["prompt_tokens"] / replies_with_usage / (sum(local) / len(local))
        completion = stats["completion_tokens"] / replies_with_usage
    return Calibration(len(chosen), answered, prompt_ratio, completion, float(stats["latency_p50"]),
                       int(stats["failures"]))



def sampled(count: int, limit: int, seed: int = 0) -> list[int]:
    """At most `limit` of range(count), at random but the same every time, in order."""
    return sorted(random.Random(seed).sample(range(count), min(limit, count)))

