"""`ppm-trl estimate`: a run's judge requests, tokens, cost and wall time, projected before any model is loaded.

    ppm-trl estimate --config run.yaml [every flag of `ppm-trl train`] [--assume_... X] [--calibrate N] [--json F]
    ppm-trl estimate prepare --dataset my.jsonl --reference-column solution --judge-model M --out data/ [...]

Training: the YAML and flags are `train`'s, read by `train`'s own parser (`cli.parse_train_args`), and the data goes
through `train`'s column mapping and checks. For a sample of rows (`--sample_rows`) a stand-in rollout is built —
the row's reference solution (else its reasoning points) repeated to `--assume_completion_tokens` policy tokens —
cut where the run's segmentation cuts it, and handed to the run's own scorer (`scorers.build_progress_scorer` /
`build_process_scorer`) in front of a judge that records its requests instead of sending them. So the requests a
rollout costs, and the prompts they carry, are the trainer's own: empty and unchanged prefixes are skipped and
identical ones sent once, as in training. `prepare`: its rows are read and skipped as `prepare` does; each distinct
row costs a points request and a graph request, whose points are assumed to be the reference's lines.

Judge tokens are counted with LiteLLM's `token_counter` (or ~4 characters a token when it cannot run); the
judge's answers are `--assume_judge_completion_tokens` long and take `--assume_latency_s`. `--calibrate N` sends N
of the recorded requests through the run's judge client (its transport, retries and rate limits; no cache) and
uses the measured prompt tokens (as a ratio to the local count), answer tokens and median latency instead. The
arithmetic — batches, steps, rate-limit bounds, cost — is `judge/projection.py`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import math
import os
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ppm_trl.judge import projection
from ppm_trl.judge.limits import prompt_tokens_estimate
from ppm_trl.judge.stats import JudgeStats
from ppm_trl.judge.tasks import JudgeTasks, with_nonce

Messages = list[dict[str, str]]

DEFAULT_JUDGE_COMPLETION_TOKENS = 400
DEFAULT_LATENCY_S = 2.0
DEFAULT_SAMPLE_ROWS = 100


# ------------------------------------------------------------------------------------------------ options
def add_estimate_arguments(parser: argparse.ArgumentParser, training: bool) -> argparse.ArgumentParser:
    """The estimate's own flags (each in `train`'s underscore and `prepare`'s dash spelling); the rest are the
    command's. `training`: also the assumptions that only a training run has."""
    group = parser.add_argument_group("estimate")

    def add(name: str, **kwargs):
        group.add_argument(f"--{name}", f"--{name.replace('_', '-')}", dest=name, **kwargs)

    if training:
        add("assume_completion_tokens", type=int, default=None,
            help="Mean rollout length in policy tokens (default: max_completion_length, every rollout uses its whole "
                 "budget: an upper bound).")
        add("assume_correct_fraction", type=float, default=1.0,
            help="PAPO: the share of rollouts that are correct, each one rubric request (default 1: an upper bound).")
        add("assume_duplicate_fraction", type=float, default=0.0,
            help="The share of the requests that repeat an earlier one (identical problem and prefix, e.g. a policy "
                 "that repeats itself); the judge's cache answers those once. Default 0.")
        add("num_processes", type=int, default=max(int(os.environ.get("WORLD_SIZE", "1") or 1), 1),
            help="Training processes (accelerate launch --num_processes); they split the run's judge limits.")
    add("assume_judge_completion_tokens", type=int, default=DEFAULT_JUDGE_COMPLETION_TOKENS,
        help=f"Tokens of one judge answer (default {DEFAULT_JUDGE_COMPLETION_TOKENS}); measured with --calibrate.")
    add("assume_latency_s", type=float, default=DEFAULT_LATENCY_S,
        help=f"Seconds one judge request takes (default {DEFAULT_LATENCY_S:g}); measured with --calibrate.")
    add("sample_rows", type=int, default=DEFAULT_SAMPLE_ROWS,
        help=f"Rows whose judge requests are rendered and counted (default {DEFAULT_SAMPLE_ROWS}, at random).")
    add("calibrate", type=int, default=0, metavar="N",
        help="Send N real requests through the run's judge client to measure tokens and latency (they cost).")
    add("json", default=None, metavar="PATH", help="Also write the estimate as JSON to PATH.")
    return parser


def check_options(options: argparse.Namespace) -> None:
    from .cli import UsageError

    checks = [("sample_rows", options.sample_rows >= 1, ">= 1"), ("calibrate", options.calibrate >= 0, ">= 0"),
              ("assume_judge_completion_tokens", options.assume_judge_completion_tokens >= 0, ">= 0"),
              ("assume_latency_s", options.assume_latency_s >= 0, ">= 0")]
    if hasattr(options, "assume_correct_fraction"):
        checks += [("assume_correct_fraction", 0.0 <= options.assume_correct_fraction <= 1.0, "in [0, 1]"),
                   ("assume_duplicate_fraction", 0.0 <= options.assume_duplicate_fraction < 1.0, "in [0, 1)"),
                   ("num_processes", options.num_processes >= 1, ">= 1"),
                   ("assume_completion_tokens", options.assume_completion_tokens is None
                    or options.assume_completion_tokens >= 1, ">= 1")]
    for name, ok, rule in checks:
        if not ok:
            raise UsageError(f"--{name} must be {rule}, got {getattr(options, name)!r}")


# ------------------------------------------------------------------------------------- recording the requests
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
        from ppm_trl.judge.transport import import_litellm

        prompt_usd, completion_usd = import_litellm().cost_per_token(model=model, prompt_tokens=prompt,
                                                                     completion_tokens=completion)
    except Exception:  # noqa: BLE001 - LiteLLM raises for a model it has no price for
        return projection.Prices(None, None), f"unpriced: LiteLLM's price table has no price for {model!r}"
    return (projection.Prices(float(prompt_usd) / prompt, float(completion_usd) / completion),
            f"LiteLLM's price table for {model}")


class CharacterTokens:
    """A stand-in policy tokenizer when the real one cannot be loaded: one token every 4 characters."""

    def __init__(self):
        self._pieces: list[str] = []
        self._ids: dict[str, int] = {}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = []
        for start in range(0, len(text), 4):
            piece = text[start:start + 4]
            if piece not in self._ids:
                self._ids[piece] = len(self._pieces)
                self._pieces.append(piece)
            ids.append(self._ids[piece])
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(self._pieces[i] for i in ids)

    def batch_decode(self, batch: Sequence[Sequence[int]], skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(ids) for ids in batch]


def policy_tokenizer(script_args, model_args):
    """(tokenizer, what it is): the policy's tokenizer (no model weights are loaded), or 4 characters a token."""
    name = model_args.model_name_or_path
    if name in (None, "", "tiny"):
        from .tiny import build_tiny_tokenizer

        return build_tiny_tokenizer(tool_calling=script_args.multiturn), "the tiny model's byte-level tokenizer"
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(os.path.expanduser(name)), f"the tokenizer of {name}"
    except (OSError, ValueError) as error:
        from .cli import _first_line

        return CharacterTokens(), (f"~4 characters a policy token (no tokenizer of {name} could be loaded: "
                                   f"{_first_line(error)[:160]})")


def stand_in_rollout(tokenizer, text: str, length: int) -> list[int]:
    """`length` policy tokens of `text` repeated (one line each time): what the rollouts are assumed to look like."""
    unit = list(tokenizer.encode(text.strip() + "\n", add_special_tokens=False))
    return (unit * math.ceil(length / len(unit)))[:length]


def rollout_text_of(row: dict[str, Any]) -> tuple[str, str]:
    """(text a rollout of this row is assumed to resemble, where it comes from)."""
    from .text import problem_text

    reference = row.get("reference")
    if isinstance(reference, str) and reference.strip():
        return reference, "reference solution (column 'reference')"
    points = row.get("reasoning_points")
    if points:
        return "\n".join(map(str, points)), "reasoning points, one a line"
    return problem_text(row), "problem text"


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
        from .cli import UsageError

        raise UsageError(f"--calibrate: the judge answered none of the {len(chosen)} requests"
                         + (f" ({judge.last_failure})" if judge.last_failure else ""))
    replies_with_usage = answered + stats["unparseable"] - stats["usage_unknown"]
    prompt_ratio = completion = None
    if replies_with_usage > 0 and stats["prompt_tokens"] > 0:
        prompt_ratio = stats["prompt_tokens"] / replies_with_usage / (sum(local) / len(local))
        completion = stats["completion_tokens"] / replies_with_usage
    return Calibration(len(chosen), answered, prompt_ratio, completion, float(stats["latency_p50"]),
                       int(stats["failures"]))


# ---------------------------------------------------------------------------------------------- the report
@dataclass
class Estimate:
    """Everything `ppm-trl estimate` prints and writes."""

    command: str
    headline: str
    judged: str
    lines: list[tuple[str, projection.Workload]]
    assumptions: list[str]
    notes: list[str]
    data: dict[str, Any]


def workload_table(lines: list[tuple[str, projection.Workload]], limits: projection.JudgeLimits) -> str:
    """The small table: one line per scope (per step, whole run)."""
    def cost(w):
        if w.cost_usd is None:
            return "unpriced"
        return f"${w.cost_usd:,.4f}" if w.cost_usd < 100 else f"${w.cost_usd:,.0f}"

    def bound(seconds, limited):
        return projection.format_seconds(seconds) if limited else "no limit"

    header = ["", "requests", "prompt tokens", "completion tokens", "cost", "time at rpm", "time at tpm",
              "time at concurrency × latency", "projected"]
    rows = [header] + [[name, f"{w.requests:,.0f}", f"{w.prompt_tokens:,.0f}", f"{w.completion_tokens:,.0f}",
                        cost(w), bound(w.seconds_rpm, limits.max_rpm is not None),
                        bound(w.seconds_tpm, limits.max_tpm is not None),
                        projection.format_seconds(w.seconds_concurrency), projection.format_seconds(w.seconds)]
                       for name, w in lines]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) if i == 0 else cell.rjust(width)
                               for i, (cell, width) in enumerate(zip(row, widths))) for row in rows)


def report(estimate: Estimate, limits: projection.JudgeLimits | None, json_path: str | None) -> None:
    print(f"ppm-trl estimate: {estimate.headline}")
    if limits is not None:
        print(f"judged: {estimate.judged}")
        print(workload_table(estimate.lines, limits))
        print("assumptions:")
        for line in estimate.assumptions:
            print(f"  - {line}")
    for line in estimate.notes:
        print(f"note: {line}")
    if json_path:
        payload = {"command": estimate.command, "headline": estimate.headline, "judged": estimate.judged,
                   **{name.split(" (")[0].replace(" ", "_"): w.to_dict() for name, w in estimate.lines},
                   "assumptions": estimate.assumptions, "notes": estimate.notes, **estimate.data}
        directory = os.path.dirname(os.path.abspath(json_path))
        os.makedirs(directory, exist_ok=True)
        with open(json_path, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=1)
        print(f"ppm-trl estimate: wrote {json_path}")


def profile_of(samples: list[Sample], calibration: Calibration | None, options,
               requests_per_unit: float | None = None) -> tuple[projection.RequestProfile, list[str]]:
    """Mean requests a unit, prompt and answer tokens a request (calibrated when measured), and what was assumed."""
    requests = [len(s.requests) for s in samples]
    tokens = [t for s in samples for t in s.tokens]
    prompt = sum(tokens) / len(tokens) if tokens else 0.0
    completion = float(options.assume_judge_completion_tokens)
    said = []
    if calibration is not None and calibration.prompt_ratio is not None:
        prompt *= calibration.prompt_ratio
        completion = calibration.completion_tokens
        said.append(f"judge tokens measured by --calibrate {calibration.sent}: prompts "
                    f"{calibration.prompt_ratio:.3f}× the local count, answers {completion:,.0f} tokens")
    else:
        said.append(f"judge answers: {completion:,.0f} tokens each (--assume_judge_completion_tokens)"
                    + ("; --calibrate got no token usage from the server" if calibration is not None else ""))
    per_unit = sum(requests) / len(requests) if requests_per_unit is None else requests_per_unit
    return projection.RequestProfile(per_unit, prompt, completion), said


def latency_of(calibration: Calibration | None, options) -> tuple[float, str]:
    if calibration is not None:
        return calibration.latency_s, (f"latency {calibration.latency_s:.2f} s a request (median of --calibrate "
                                       f"{calibration.sent}; {calibration.failures} failed)")
    return options.assume_latency_s, f"latency {options.assume_latency_s:g} s a request (--assume_latency_s)"


def sampled(count: int, limit: int, seed: int = 0) -> list[int]:
    """At most `limit` of range(count), at random but the same every time, in order."""
    return sorted(random.Random(seed).sample(range(count), min(limit, count)))


# ------------------------------------------------------------------------------------------------ training
def judged_task(training_args) -> tuple[str | None, str]:
    """('ppm' | 'papo' | None, what the judge does in this run, or why nothing)."""
    from .configs import PAPOConfig, PPMConfig

    if isinstance(training_args, PPMConfig):
        if training_args.progress_scorer != "judge":
            return None, f"PPM's progress_scorer={training_args.progress_scorer} asks no judge"
        if training_args.progress_mode == "process_reward":
            return "ppm", (f"each rollout's {training_args.num_segments} chunks ({training_args.segmentation}), each "
                           "judged alone (process-reward baseline, App. D process prompt)")
        return "ppm", (f"each rollout's {training_args.num_segments} prefixes ({training_args.segmentation}), graded "
                       "against the row's reasoning points (PPM App. D prompt)")
    if isinstance(training_args, PAPOConfig):
        if training_args.process_scorer != "judge":
            return None, f"PAPO's process_scorer={training_args.process_scorer} asks no judge"
        return "papo", f"each correct rollout, scored by the {training_args.rubric} rubric (PAPO A.3 prompt)"
    return None, "this method asks no judge (ARG and GRPO verify answers with their reward functions)"


def training_schedule(argv: list[str], training_args, rows: int, processes: int) -> dict[str, Any]:
    """TRL's batches and steps for this run (`projection`), with the generation batch fitted for `processes` as
    `train` fits it under `accelerate launch --num_processes`."""
    import dataclasses

    from .cli import _config_path, _user_setting, fit_generation_batch, read_yaml_config
    from .configs import BATCH_KEYS

    path = _config_path(argv)
    config = read_yaml_config(path) if path else {}
    given = {key: _user_setting(argv, config, key) for key in BATCH_KEYS}
    per_device, generations = training_args.per_device_train_batch_size, training_args.num_generations
    accumulation = training_args.gradient_accumulation_steps
    if processes != 1:  # `train` fitted the batch for one process; refit it for the processes it will run on
        defaults = {f.name: f.default for f in dataclasses.fields(type(training_args)) if f.name in BATCH_KEYS}
        derived, _ = fit_generation_batch(given, defaults, processes)
        if given["gradient_accumulation_steps"] is None:
            # the configs leave it unset (None) by default, which means TRL's 1
            accumulation = derived.get("gradient_accumulation_steps", defaults.get("gradient_accumulation_steps") or 1)

    def number(key):
        return int(given[key]) if given[key] is not None else None

    per_generation = projection.steps_per_generation(accumulation, per_device, processes,
                                                     number("steps_per_generation"), number("generation_batch_size"))
    iterations = training_args.num_iterations
    batch = projection.generation_batch_size(per_device, processes, per_generation)
    epoch_steps = projection.steps_per_epoch(rows, generations, batch, per_generation, iterations, accumulation)
    steps = projection.run_steps(training_args.max_steps, training_args.num_train_epochs, epoch_steps)
    return {"processes": processes, "per_device_train_batch_size": per_device, "num_generations": generations,
            "gradient_accumulation_steps": accumulation, "steps_per_generation": per_generation,
            "num_iterations": iterations, "generation_batch": batch, "prompts_per_batch": batch // generations,
            "steps_per_epoch": epoch_steps, "steps": steps,
            "steps_from": "max_steps" if training_args.max_steps > 0 else
            f"num_train_epochs={training_args.num_train_epochs:g} × {epoch_steps} steps an epoch",
            "generation_batches": projection.generation_batches(steps, accumulation, per_generation, iterations),
            "batches_per_step": projection.batches_per_step(accumulation, per_generation, iterations)}


def ppm_prefix_texts(training_args, tokenizer, ids: list[int]) -> list[str]:
    """The K texts `PPMGRPOTrainer._score_progress` hands its scorer for a rollout of `ids` (prefixes c_1..c_k, or
    the chunks c_k alone for process_reward), cut by the run's segmentation (turns: K equal parts, stated)."""
    import torch

    from .segments import delimiter_prefix_lengths, segment_prefix_lengths

    segments = training_args.num_segments
    if training_args.segmentation == "delimiter":
        prefix = delimiter_prefix_lengths([ids], lambda x: tokenizer.decode(x, skip_special_tokens=True),
                                          training_args.segment_delimiter, segments)[0].tolist()
    else:
        budget = training_args.max_completion_length if training_args.segmentation == "equal_chunks" else len(ids)
        prefix = segment_prefix_lengths(torch.tensor([len(ids)]), budget, segments)[0].tolist()
    starts = [0] + prefix[:-1] if training_args.progress_mode == "process_reward" else [0] * segments
    return tokenizer.batch_decode([ids[s:e] for s, e in zip(starts, prefix)], skip_special_tokens=True)


def cpu_precision(argv: list[str]) -> list[str]:
    """Flags that let a GPU run's config parse on a machine without one (transformers refuses bf16/fp16 there):
    the precision does not change what the judge is asked, and the estimate is often made before renting the GPU."""
    import torch

    return [] if torch.cuda.is_available() else ["--bf16", "false", "--fp16", "false"]


def estimate_training(argv: list[str], options) -> tuple[Estimate, projection.JudgeLimits | None]:
    from .cli import (
        UsageError,
        load_train_dataset,
        parse_train_args,
        prepare_dataset,
        reward_names,
    )
    from .methods import get_method
    from .scorers import build_process_scorer, build_progress_scorer

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            script_args, training_args, model_args = parse_train_args(argv + cpu_precision(argv))
    finally:
        for line in said.getvalue().splitlines():  # `train`'s note on the batch it fitted is for one process
            if options.num_processes == 1 or not line.startswith("ppm-trl train: num_generations="):
                print(line, file=sys.stderr)
    if script_args.multiturn and script_args.env_name:  # `train` sets these in build_trainer
        from .envs.multiturn import multiturn_config_kwargs

        for key, value in multiturn_config_kwargs(script_args.env_n, script_args.tokens_per_turn,
                                                  script_args.tool_tokens_per_turn,
                                                  use_vllm=training_args.use_vllm).items():
            if hasattr(training_args, key):
                setattr(training_args, key, value)
    source = script_args.dataset_name or f"env {script_args.env_name!r}"
    dataset = prepare_dataset(script_args, training_args, load_train_dataset(script_args),
                              reward_names(script_args), source)
    schedule = training_schedule(argv, training_args, len(dataset), options.num_processes)
    method = get_method(script_args.method).name
    task, judged = judged_task(training_args)
    headline = (f"{method} on {source}: {len(dataset):,} rows, {schedule['steps']:,} steps ({schedule['steps_from']}), "
                f"{schedule['generation_batch']} rollouts judged per generation batch ({schedule['prompts_per_batch']} "
                f"prompt(s) × {schedule['num_generations']}), {schedule['generation_batches']:,} generation batches")
    data: dict[str, Any] = {"method": method, "rows": len(dataset), "schedule": schedule}
    if task is None:
        return Estimate("train", headline, judged, [], [], [f"no judge requests: {judged}"], data), None

    length = options.assume_completion_tokens or training_args.max_completion_length
    if length > training_args.max_completion_length:
        raise UsageError(f"--assume_completion_tokens {length} is longer than max_completion_length="
                         f"{training_args.max_completion_length}")
    tokenizer, tokenizer_said = policy_tokenizer(script_args, model_args)
    recorder = RecordingJudge()
    scorer = (build_progress_scorer(training_args, judge=recorder) if task == "ppm"
              else build_process_scorer(training_args, judge=recorder))
    samples, sources = [], set()
    for index in sampled(len(dataset), options.sample_rows):
        row = dataset[index]
        text, where = rollout_text_of(row)
        sources.add(where)
        ids = stand_in_rollout(tokenizer, text, length)
        if task == "ppm":
            scorer([row], [ppm_prefix_texts(training_args, tokenizer, ids)])
        else:
            scorer([row], [tokenizer.decode(ids, skip_special_tokens=True)])
        samples.append(Sample(recorder.take()))
    count, counter_said = judge_token_counter(training_args.judge_model)
    count_samples(samples, count, training_args.judge_echo_nonce)
    calibration = None
    if options.calibrate:
        from .judge import LiteLLMJudge

        kwargs = training_args.judge_kwargs(training_args.output_dir)
        judge = LiteLLMJudge(**{**kwargs, "cache_dir": None, "max_cost_usd": None, "max_total_tokens": None,
                                "processes": 1})
        calibration = calibrate(judge, samples, options.calibrate)
    correct = options.assume_correct_fraction if task == "papo" else None
    profile, tokens_said = profile_of(samples, calibration, options,
                                      requests_per_unit=correct if task == "papo" else None)
    latency, latency_said = latency_of(calibration, options)
    limits = projection.JudgeLimits(training_args.judge_max_rpm, training_args.judge_max_tpm,
                                    training_args.judge_max_concurrency, latency, options.num_processes)
    prices, prices_said = judge_prices(training_args.judge_model, profile.prompt_tokens, profile.completion_tokens)
    batch = projection.batch_workload(schedule["generation_batch"], profile, limits, prices,
                                      options.assume_duplicate_fraction)
    per_step = batch.scaled(schedule["batches_per_step"])
    run = batch.scaled(schedule["generation_batches"])

    budget_default = length == training_args.max_completion_length and options.assume_completion_tokens is None
    assumptions = [
        f"rollouts: {length} policy tokens each"
        + (" (max_completion_length: every rollout uses its whole budget, an upper bound; "
           "--assume_completion_tokens for a shorter mean)" if budget_default else " (--assume_completion_tokens)")
        + f", whose text is the row's {' / '.join(sorted(sources))} repeated to that length; policy tokens "
          f"counted with {tokenizer_said}",
        ("distinct rollouts: no two share a prefix, so only the requests the scorer itself skips (empty prefixes, "
         "prefixes that do not change after a rollout ends) are left out" if task == "ppm" else
         "distinct rollouts: no two correct responses are the same text")
        + (f", and --assume_duplicate_fraction {options.assume_duplicate_fraction:g} of the rest repeat an earlier "
           "request (answered once by the judge's cache)" if options.assume_duplicate_fraction else
           "; identical requests would be sent once (--assume_duplicate_fraction)"),
    ]
    if task == "papo":
        assumptions.append(f"a share {correct:g} of the rollouts is correct (--assume_correct_fraction"
                           + ("; 1 is an upper bound" if correct == 1.0 else "") + "), one rubric request each")
    else:
        assumptions.append(f"{profile.requests_per_unit:.2f} requests a rollout (of {training_args.num_segments} "
                           "segments), measured on the stand-in rollouts of the sampled rows")
    assumptions += [
        f"judge prompts: the run's own prompts rendered on {len(samples)} sampled row(s), {profile.prompt_tokens:,.0f} "
        f"tokens on average, counted with {counter_said}",
        *tokens_said, latency_said, f"cost: {prices_said}",
        f"wall time is the judge's own (the slowest of the three bounds): rate limits at their steady rate, "
        f"{options.num_processes} process(es) sharing the limits; with overlap_scoring it runs under TRL's log-prob "
        "passes",
        "no retries or failures; the probe request at start-up is not counted",
    ]
    notes = budget_notes(per_step, training_args.judge_max_cost_usd, training_args.judge_max_total_tokens,
                         schedule["steps"], "step")
    if not script_args.multiturn:
        notes.append("prompts longer than the model takes are not left out here (`train` leaves them out and counts "
                     "them)")
    if task == "ppm" and training_args.segmentation == "turns":
        notes.append("turn segments: a rollout's K turns are assumed to be K equal parts of it")
    data.update(judge_model=training_args.judge_model, task=task, profile=profile.__dict__,
                calibration=None if calibration is None else calibration.to_dict(),
                options={k: v for k, v in vars(options).items() if k != "json"}, token_counter=counter_said,
                prices=prices_said, limits=limits.__dict__)
    lines = [("per step", per_step), (f"whole run ({schedule['steps']:,} steps)", run)]
    return Estimate("train", headline, judged, lines, assumptions, notes, data), limits


def budget_notes(per_unit: projection.Workload, max_cost_usd, max_total_tokens, units: int, unit: str) -> list[str]:
    """Where a judge budget would stop the run, if it is set."""
    notes = []
    for budget, amount, flag in ((max_cost_usd, per_unit.cost_usd, "judge_max_cost_usd"),
                                 (max_total_tokens, per_unit.total_tokens, "judge_max_total_tokens")):
        if budget is None:
            continue
        if amount is None:
            notes.append(f"{flag}={budget:g} cannot be kept: the judge model is unpriced")
            continue
        lasts = projection.steps_within_budget(amount, budget)
        if lasts is not None and lasts < units:
            notes.append(f"{flag}={budget:g} would stop the run after about {math.ceil(lasts):,} of {units:,} {unit}s")
        elif lasts is not None:
            notes.append(f"{flag}={budget:g} lasts the whole run (about {lasts:,.0f} {unit}s' worth)")
    return notes


# ------------------------------------------------------------------------------------------------- prepare
def finished_rows(path: str) -> set[int]:
    """Rows an earlier `prepare` already wrote to its progress file (it resumes without them)."""
    if not os.path.exists(path):
        return set()
    done = set()
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "index" in record:
                done.add(int(record["index"]))
    return done


def estimate_prepare(argv: list[str]) -> tuple[Estimate, projection.JudgeLimits, str | None]:
    from . import prepare as prep
    from .columns import is_solution_column
    from .judge import LiteLLMJudge

    parser = add_estimate_arguments(prep.add_prepare_arguments(argparse.ArgumentParser(
        prog="ppm-trl estimate prepare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)),
        training=False)
    options = parser.parse_args(prep.normalize_flags(argv, parser))
    check_options(options)
    dataset = prep.load_rows(options)
    prep.check_columns(dataset, options)
    rows = dataset.to_list()
    solution_column = options.answer_column is not None and (
        options.answer_column == options.reference_column or is_solution_column(dataset[options.answer_column]))
    done = finished_rows(os.path.join(prep.work_dir_of(options), prep.PROGRESS_FILE))
    jobs, unusable = [], 0
    for index, row in enumerate(rows):  # read as `prepare` reads them: an unusable row costs no request
        if index in done:
            continue
        try:
            problem = prep.problem_of(row[options.problem_column], options.problem_column, index)
            reference = prep.reference_of(row[options.reference_column], options.reference_column, index)
            answer, _ = prep.answer_of(row, options, index, solution_column)
        except ValueError:
            unusable += 1
            continue
        if answer is None:
            unusable += 1
            continue
        jobs.append((index, problem, reference, answer))
    groups = prep.duplicate_groups(jobs)
    headline = (f"prepare {options.dataset}: {len(rows):,} rows, {len(done):,} already done, {unusable:,} unusable "
                f"(no request), {len(jobs) - len(groups):,} duplicates (judged once): {len(groups):,} rows to judge")
    judged = "each distinct row: its reasoning points (App. D rubric prompt), then their obsoletion graph"
    recorder = RecordingJudge()
    samples = []
    for position in sampled(len(groups), options.sample_rows):
        _, problem, reference, answer = groups[position][0]
        recorder.generate_points(problem, reference, answer)
        points = [line.strip() for line in reference.splitlines() if line.strip()] or [reference.strip()]
        recorder.generate_graph(problem, points)
        samples.append(Sample(recorder.take()))
    count, counter_said = judge_token_counter(options.judge_model)
    count_samples(samples, count, options.echo_nonce)
    calibration = None
    if options.calibrate and samples:
        judge = LiteLLMJudge(options.judge_model, api_base=options.api_base, max_concurrency=options.max_concurrency,
                             timeout=options.timeout, num_retries=options.num_retries,
                             temperature=options.temperature, cache_dir=None, api_key_env=options.api_key_env,
                             transport=options.transport, max_rpm=options.max_rpm, max_tpm=options.max_tpm,
                             max_response_bytes=options.max_response_bytes, echo_nonce=options.echo_nonce)
        calibration = calibrate(judge, samples, options.calibrate)
    profile, tokens_said = (profile_of(samples, calibration, options) if samples else
                            (projection.RequestProfile(2.0, 0.0, 0.0), []))
    latency, latency_said = latency_of(calibration, options)
    limits = projection.JudgeLimits(options.max_rpm, options.max_tpm, options.max_concurrency, latency)
    prices, prices_said = judge_prices(options.judge_model, profile.prompt_tokens, profile.completion_tokens)
    run = projection.batch_workload(len(groups), profile, limits, prices)
    per_row = run.scaled(1 / len(groups)) if groups else run
    assumptions = [
        "each distinct row: one points request and one graph request (no retries: an answer whose last point does "
        "not state the gold answer is asked again, and would cost more)",
        "the graph request's points: one per non-empty line of the reference solution (the judge writes its own)",
        f"judge prompts: the App. D prompts rendered on {len(samples)} sampled row(s), {profile.prompt_tokens:,.0f} "
        f"tokens on average, counted with {counter_said}",
        *tokens_said, latency_said, f"cost: {prices_said}",
        "wall time is the judge's own (the slowest of the three bounds), rate limits at their steady rate; "
        "answers already in the judge cache are not subtracted",
    ]
    notes = budget_notes(per_row, options.max_cost_usd, options.max_total_tokens, len(groups), "row")
    data = {"rows": len(rows), "done": len(done), "unusable": unusable, "to_judge": len(groups),
            "judge_model": options.judge_model, "profile": profile.__dict__,
            "calibration": None if calibration is None else calibration.to_dict(),
            "options": {k: getattr(options, k) for k in ("assume_judge_completion_tokens", "assume_latency_s",
                                                          "sample_rows", "calibrate")},
            "token_counter": counter_said, "prices": prices_said, "limits": limits.__dict__}
    lines = [("per row", per_row), (f"whole run ({len(groups):,} rows)", run)]
    return Estimate("prepare", headline, judged, lines, assumptions, notes, data), limits, options.json


# ---------------------------------------------------------------------------------------------------- entry
def check_estimate_typos(rest: list[str], options_parser: argparse.ArgumentParser) -> None:
    """A mistyped estimate flag (`--assume_corect_fraction`) would reach `train`'s parser, which knows no estimate
    flag to suggest: name the closest one here."""
    from .cli import UsageError, _closest, train_fields

    known = {f"--{name}" for name in train_fields(rest)} | {"--config"}
    ours = {option: action.option_strings[0] for action in options_parser._actions for option in action.option_strings}
    for arg in rest:
        flag = arg.split("=", 1)[0]
        if flag.startswith("--") and flag not in known and flag.replace("-", "_") not in known:
            close = list(dict.fromkeys(ours[option] for option in _closest(flag, list(ours))))
            if close:
                raise UsageError(f"unknown flag {flag}; did you mean {' or '.join(close)}?")


def main(argv: list[str]) -> None:
    """`ppm-trl estimate [train flags]` or `ppm-trl estimate prepare [prepare flags]`, each with the estimate's."""
    argv = list(argv)
    if argv and argv[0] == "prepare":
        report(*estimate_prepare(argv[1:]))
        return
    if argv and argv[0] == "train":
        argv = argv[1:]
    options_parser = add_estimate_arguments(argparse.ArgumentParser(prog="ppm-trl estimate", add_help=False,
                                                                    allow_abbrev=False), training=True)
    if any(arg in ("-h", "--help") for arg in argv):
        print(__doc__)
        options_parser.print_help()
        print("\nand every flag and YAML key of `ppm-trl train` (`ppm-trl train --help`); `ppm-trl estimate prepare "
              "--help` for prepare's")
        return
    options, rest = options_parser.parse_known_args(argv)
    check_options(options)
    check_estimate_typos(rest, options_parser)
    estimate, limits = estimate_training(rest, options)
    report(estimate, limits, options.json)
