"""`ppm-trl estimate [train flags]`: the run's own parse, data and scorer, in front of a judge that records the
requests of stand-in rollouts (a row's reference solution repeated to `--assume_completion_tokens` policy tokens, cut
where the run's segmentation cuts it); TRL's batches and steps give how many such batches the run judges."""

from __future__ import annotations

import contextlib
import io
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

from ppm_trl.data import load_train_dataset, prepare_dataset
from ppm_trl.estimate.measure import (
    RecordingJudge,
    Sample,
    calibrate,
    count_samples,
    judge_prices,
    judge_token_counter,
    sampled,
)
from ppm_trl.estimate.projection_report import Estimate, budget_notes, latency_of, profile_of
from ppm_trl.flags import UsageError, config_path, read_yaml_config, user_setting
from ppm_trl.judge import projection
from ppm_trl.train import fit_generation_batch, parse_train_args, reward_names


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
        from ppm_trl.tiny import build_tiny_tokenizer

        return build_tiny_tokenizer(tool_calling=script_args.multiturn), "the tiny model's byte-level tokenizer"
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(os.path.expanduser(name)), f"the tokenizer of {name}"
    except (OSError, ValueError) as error:
        from ppm_trl.flags import first_line

        return CharacterTokens(), (f"~4 characters a policy token (no tokenizer of {name} could be loaded: "
                                   f"{first_line(error)[:160]})")


def stand_in_rollout(tokenizer, text: str, length: int) -> list[int]:
    """`length` policy tokens of `text` repeated (one line each time): what the rollouts are assumed to look like."""
    unit = list(tokenizer.encode(text.strip() + "\n", add_special_tokens=False))
    return (unit * math.ceil(length / len(unit)))[:length]


def rollout_text_of(row: dict[str, Any]) -> tuple[str, str]:
    """(text a rollout of this row is assumed to resemble, where it comes from)."""
    from ppm_trl.text import problem_text

    reference = row.get("reference")
    if isinstance(reference, str) and reference.strip():
        return reference, "reference solution (column 'reference')"
    points = row.get("reasoning_points")
    if points:
        return "\n".join(map(str, points)), "reasoning points, one a line"
    return problem_text(row), "problem text"


# ------------------------------------------------------------------------------------------------ training
def judged_task(training_args) -> tuple[str | None, str]:
    """('ppm' | 'papo' | None, what the judge does in this run, or why nothing)."""
    from ppm_trl.papo.papo_config import PAPOConfig
    from ppm_trl.ppm.ppm_config import PPMConfig

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

    from ppm_trl.configs import BATCH_KEYS

    path = config_path(argv)
    config = read_yaml_config(path) if path else {}
    given = {key: user_setting(argv, config, key) for key in BATCH_KEYS}
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

    from ppm_trl.ppm.segmentation import delimiter_prefix_lengths, segment_prefix_lengths

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
    from ppm_trl.papo.process_scorers import build_process_scorer
    from ppm_trl.ppm.progress_scorers import build_progress_scorer
    from ppm_trl.registry import get_method

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            script_args, training_args, model_args = parse_train_args(argv + cpu_precision(argv))
    finally:
        for line in said.getvalue().splitlines():  # `train`'s note on the batch it fitted is for one process
            if options.num_processes == 1 or not line.startswith("ppm-trl train: num_generations="):
                print(line, file=sys.stderr)
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
        from ppm_trl.judge import build_judge

        judge = build_judge(training_args, cache_dir=None, max_cost_usd=None, max_total_tokens=None, processes=1)
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

