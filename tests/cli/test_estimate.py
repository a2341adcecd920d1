"""`ppm-trl estimate` (issue 32 item 2): the projection's arithmetic by hand, TRL's own sampler for the schedule, and
the projection of short PPM and PAPO runs and of a `prepare` against what the loopback judge then counted."""

from __future__ import annotations

import itertools
import json
import math

import judge_server
import pytest
from judge_server import JudgeServer

from ppm_trl import cli
from ppm_trl.judge import projection as P

pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

JUDGE = "openai/loopback-judge"
LENGTH, GENERATIONS, SEGMENTS = 128, 4, 4


# ----------------------------------------------------------------------------------------------- arithmetic
def test_schedule_by_hand():
    # README: 512 rows, 8 generations, a batch of 8, no accumulation: 512 steps an epoch, TRL's 3 epochs 1,536 steps.
    assert P.steps_per_generation(1, 8, 1) == 1 and P.generation_batch_size(8, 1, 1) == 8
    assert P.steps_per_epoch(512, 8, 8, 1, 1, 1) == 512
    assert P.run_steps(-1, 3.0, 512) == 1536 and P.run_steps(50, 3.0, 512) == 50
    # PPM's 16 generations on a batch of 8: accumulation 2, one prompt (16 rollouts) a step.
    assert P.generation_batch_size(8, 1, P.steps_per_generation(2, 8, 1)) == 16
    assert P.steps_per_epoch(100, 16, 16, 2, 1, 2) == 100
    # A generation every other step (steps_per_generation 4, accumulation 2), or every other with num_iterations 2.
    assert P.generation_batches(10, 2, 4, 1) == 5 and P.batches_per_step(2, 4, 1) == 0.5
    assert P.generation_batches(10, 1, 1, 2) == 5
    assert P.steps_per_generation(2, 8, 2, given_generation_batch_size=64) == 4


@pytest.mark.parametrize("rows, generations, per_device, accumulation, per_generation, iterations", [
    (512, 8, 8, 1, 1, 1), (100, 16, 8, 2, 2, 1), (37, 4, 4, 3, 3, 2), (50, 8, 4, 2, 4, 1), (9, 4, 8, 1, 1, 1)])
def test_steps_per_epoch_is_trls(rows, generations, per_device, accumulation, per_generation, iterations):
    """One process: TRL's RepeatSampler feeds a dataloader of generation batches (b × S rows), and transformers
    counts ceil(its length / A) steps an epoch."""
    from trl.trainer.utils import RepeatSampler

    batch = P.generation_batch_size(per_device, 1, per_generation)
    sampler = RepeatSampler(data_source=list(range(rows)), mini_repeat_count=generations,
                            batch_size=batch // generations, repeat_count=iterations * per_generation)
    micro_steps = math.ceil(len(sampler) / (per_device * per_generation))
    expected = max(math.ceil(micro_steps / accumulation), 1)
    assert P.steps_per_epoch(rows, generations, batch, per_generation, iterations, accumulation) == expected


def test_workload_by_hand():
    limits = P.JudgeLimits(max_rpm=600, max_tpm=60_000, max_concurrency=32, latency_s=2.0, processes=2)
    profile = P.RequestProfile(requests_per_unit=4, prompt_tokens=900, completion_tokens=100)
    batch = P.batch_workload(16, profile, limits, P.Prices(1e-7, 4e-7), duplicate_fraction=0.25)
    assert batch.requests == 48  # 16 rollouts × 4 prefixes, a quarter of them repeats answered by the cache
    assert (batch.prompt_tokens, batch.completion_tokens) == (43_200, 4_800)
    assert batch.cost_usd == pytest.approx(43_200e-7 + 4_800 * 4e-7)  # $0.00624
    assert batch.seconds_rpm == pytest.approx(4.8)  # 48 requests at 600 a minute
    assert batch.seconds_tpm == pytest.approx(48.0)  # 48,000 tokens at 60,000 a minute
    assert batch.seconds_concurrency == 4.0  # 24 requests a process, 16 slots each: 2 waves of 2 s
    assert batch.seconds == 48.0  # the slowest bound
    run = batch.scaled(10)
    assert (run.requests, run.seconds, run.cost_usd) == (480, 480.0, pytest.approx(0.0624))
    unlimited = P.batch_workload(16, profile, P.JudgeLimits(None, None, 64, 1.5), P.Prices(None, None))
    assert unlimited.cost_usd is None and (unlimited.seconds_rpm, unlimited.seconds_tpm) == (0.0, 0.0)
    assert unlimited.seconds == 1.5  # 64 requests, 64 slots: one wave
    assert P.requests_of(10, 3, 0.5) == 15 and P.steps_within_budget(0.25, 5.0) == 20
    with pytest.raises(ValueError, match="duplicate_fraction"):
        P.requests_of(1, 1, 1.0)


def test_calibration_order_spreads_and_never_repeats():
    order = P.calibration_order([4, 4, 4, 4])
    assert order[:4] == [(0, 0), (1, 1), (2, 2), (3, 3)]  # four units, each at another prefix
    assert len(order) == len(set(order)) == 16
    assert P.calibration_order([2, 1, 0]) == [(0, 0), (1, 0), (0, 1)]


def test_format_seconds():
    assert [P.format_seconds(s) for s in (0, 4.25, 42, 185, 7_620, 3 * 86_400 + 4 * 3600)] == [
        "0 s", "4.2 s", "42 s", "3 min 05 s", "2 h 07 min", "3 d 04 h"]


# ------------------------------------------------------------------------------------------------ the command
def _rows():
    rows = []
    for a in range(10, 18):
        b, total = a + 5, 2 * (2 * a + 5)
        rows.append({
            "prompt": [{"role": "user", "content": f"Add {a} and {b}, then double the sum."}],
            "answer": str(total),
            "reference": f"{a} + {b} = {a + b}\n{a + b} * 2 = {total}\nThe answer is \\boxed{{{total}}}.",
            "reasoning_points": [f'computes "{a} + {b} = {a + b}"', f'computes "{a + b} * 2 = {total}"',
                                 f'states the final answer "\\boxed{{{total}}}"'],
            "reasoning_graph": [{"if_all": [3], "makes_obsolete": [1, 2]}],
        })
    return rows


def _write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _flags(tmp_path, api_base, *method):
    return ["--dataset_name", _write(tmp_path / "data.jsonl", _rows()), *method, "--model_name_or_path", "tiny",
            "--use_cpu", "true", "--max_steps", "2", "--num_generations", str(GENERATIONS),
            "--per_device_train_batch_size", "4", "--max_completion_length", str(LENGTH), "--judge_model", JUDGE,
            "--judge_api_base", api_base, "--judge_transport", "openai_http", "--judge_probe", "false",
            "--judge_cache_dir", str(tmp_path / "cache"), "--output_dir", str(tmp_path / "out"), "--report_to", "none",
            "--save_strategy", "no", "--logging_steps", "1", "--disable_tqdm", "true"]


def _estimate(tmp_path, flags):
    path = tmp_path / "estimate.json"
    cli.main(["estimate", *flags, "--json", str(path)])
    return json.loads(path.read_text())


def test_estimate_counts_what_the_scorer_skips_and_the_cache_dedups(tmp_path, capsys):
    """Rollouts half the budget reach 2 of 4 equal chunks (the rest repeat the last prefix: no request); half the
    requests repeat (cache); two processes double the batch; no request is sent."""
    flags = _flags(tmp_path, "http://127.0.0.1:9/v1", "--method", "ppm", "--progress_scorer", "judge",
                   "--num_segments", str(SEGMENTS), "--judge_max_rpm", "30")
    estimate = _estimate(tmp_path, [*flags, "--assume_completion_tokens", str(LENGTH // 2),
                                    "--assume_duplicate_fraction", "0.5", "--num_processes", "2"])
    assert estimate["profile"]["requests_per_unit"] == 2
    assert estimate["schedule"]["generation_batch"] == 8 and estimate["schedule"]["steps"] == 2
    assert estimate["per_step"]["requests"] == 8  # 8 rollouts × 2 prefixes × (1 − 0.5)
    assert estimate["per_step"]["seconds_rpm"] == pytest.approx(16.0)  # 8 requests at 30 a minute
    assert estimate["whole_run"]["requests"] == 16 and estimate["whole_run"]["cost_usd"] is None
    out = capsys.readouterr().out
    assert "per step" in out and "whole run (2 steps)" in out and "unpriced" in out

    cli.main(["estimate", "--dataset_name", str(tmp_path / "data.jsonl"), "--method", "arg", "--model_name_or_path",
              "tiny", "--max_steps", "2", "--output_dir", str(tmp_path / "arg")])
    assert "no judge requests: this method asks no judge" in capsys.readouterr().out


def _rollout(reference: str, serial: int, correct: bool = True) -> str:
    """A rollout like the reference that uses its whole budget (the estimate's default assumption): LENGTH tokens on
    the byte-level tiny tokenizer, no EOS; unique — a serial written over "The a" of its first "The answer is" line,
    inside the first segment, so that no two rollouts share a prefix (the judge would answer those once), with the
    same length and line ends as the stand-in; its answer wrong when not `correct`."""
    body = ((reference.strip() + "\n") * LENGTH)[:LENGTH]
    start = body.index("The answer")
    body = body[:start] + f"#{serial:04d}" + body[start + 5:]
    if not correct:
        box = reference[reference.rindex("\\boxed{"):].split("}")[0]
        body = body.replace(box, box[:-1] + str((int(box[-1]) + 1) % 10))
    return body


def _scripted_generation(monkeypatch, wrong_every_other: bool = False) -> list[str]:
    """The trainers' generation backend replaced by `_rollout` (the policy is not what is measured here)."""
    from ppm_trl.trainers.base import MethodTrainer

    references = {row["prompt"][0]["content"]: row["reference"] for row in _rows()}
    serials, texts = itertools.count(), []

    def sample(self, prompt_ids, images=None, multimodal_fields=None, num_generations=1, has_tool_images=False):
        tokenizer = self.processing_class
        out = []
        for ids in prompt_ids:
            prompt = tokenizer.decode(ids)
            reference = next(ref for problem, ref in references.items() if problem in prompt)
            serial = next(serials)
            texts.append(_rollout(reference, serial, correct=not (wrong_every_other and serial % 2)))
            out.append(tokenizer(texts[-1], add_special_tokens=False)["input_ids"])
        return out, None

    monkeypatch.setattr(MethodTrainer, "sample_completion_ids", sample)
    return texts


def _count_like_the_estimate(monkeypatch):
    """The loopback server counts tokens as the estimate does (LiteLLM's token_counter), not as words."""
    from ppm_trl.judge.transport import import_litellm

    litellm = import_litellm()
    monkeypatch.setattr(judge_server, "count_tokens", lambda text: litellm.token_counter(model=JUDGE, text=text))


def _close(projected: float, counted: float) -> bool:
    return abs(projected - counted) <= 0.10 * counted


@pytest.mark.parametrize("method", ["ppm", "papo"])
def test_projection_matches_a_short_run(tmp_path, monkeypatch, method):
    """`estimate --calibrate`, then `train` with the same flags against the loopback judge: the run's requests and
    prompt and answer tokens, as the judge counted them, are within 10 % of the projection."""
    _count_like_the_estimate(monkeypatch)
    texts = _scripted_generation(monkeypatch, wrong_every_other=method == "papo")
    with JudgeServer() as server:
        scorer = (["--progress_scorer", "judge", "--num_segments", str(SEGMENTS)] if method == "ppm"
                  else ["--process_scorer", "judge"])
        flags = _flags(tmp_path, server.api_base, "--method", method, *scorer)
        assumption = ["--assume_correct_fraction", "0.5"] if method == "papo" else []
        estimate = _estimate(tmp_path, [*flags, *assumption, "--calibrate", "8"])
        assert estimate["calibration"]["answered"] == 8
        server.reset_counters()
        cli.main(["train", *flags])
        counted = {"requests": server.requests, "prompt_tokens": server.tokens_served["prompt"],
                   "completion_tokens": server.tokens_served["completion"]}
    run = estimate["whole_run"]
    projected = {key: run[key] for key in counted}
    print(f"{method}: projected {projected}, counted {counted}")
    assert len(texts) == 2 * GENERATIONS  # 2 steps of one prompt × 4 rollouts
    if method == "papo":  # the assumed share of correct rollouts is the real one
        from ppm_trl.rewards import accuracy_reward

        answers = {row["reference"].splitlines()[0]: row["answer"] for row in _rows()}
        golds = [answers[text.splitlines()[0]] for text in texts]
        assert accuracy_reward(texts, answer=golds) == [1.0, 0.0] * GENERATIONS
    assert counted["requests"] == (2 * GENERATIONS * SEGMENTS if method == "ppm" else GENERATIONS)
    assert all(_close(projected[key], counted[key]) for key in counted), (projected, counted)


def test_prepare_projection_matches_prepare(tmp_path, monkeypatch):
    """`estimate prepare --calibrate` against the real `prepare` on the same file: a duplicate row is judged once, a
    row without an answer costs nothing, and the requests and tokens are within 10 %."""
    _count_like_the_estimate(monkeypatch)
    raw = [{"question": row["prompt"][0]["content"], "solution": row["reference"]} for row in _rows()]
    data = _write(tmp_path / "raw.jsonl", [*raw, raw[0], {"question": "No answer?", "solution": "It depends."}])
    with JudgeServer() as server:
        flags = ["--dataset", data, "--problem-column", "question", "--reference-column", "solution",
                 "--judge-model", "hosted_vllm/scripted-judge", "--api-base", server.api_base, "--transport",
                 "openai_http", "--out", str(tmp_path / "prepared"), "--no-progress"]
        path = tmp_path / "prepare_estimate.json"
        cli.main(["estimate", "prepare", *flags, "--calibrate", "4", "--json", str(path)])
        estimate = json.loads(path.read_text())
        server.reset_counters()
        cli.main(["prepare", *flags, "--no-judge-probe"])
        counted = {"requests": server.requests, "prompt_tokens": server.tokens_served["prompt"],
                   "completion_tokens": server.tokens_served["completion"]}
    assert (estimate["to_judge"], estimate["unusable"]) == (8, 1)
    projected = {key: estimate["whole_run"][key] for key in counted}
    print(f"prepare: projected {projected}, counted {counted}")
    assert counted["requests"] == projected["requests"] == 16
    assert all(_close(projected[key], counted[key]) for key in counted), (projected, counted)


def test_readme_estimate_command_runs_as_written(monkeypatch, capsys):
    """The README's first `ppm-trl estimate` line, verbatim, from the repository root (offline: the Qwen tokenizer
    is not cached, so policy tokens are counted as 4 characters each, and the estimate says so)."""
    import shlex
    from pathlib import Path

    from helpers import readme_block

    block = next(readme_block("Command line", "bash", index=i) for i in range(1, 4)
                 if readme_block("Command line", "bash", index=i).startswith("ppm-trl estimate"))
    argv = shlex.split(block.splitlines()[0])
    assert argv[:2] == ["ppm-trl", "estimate"]
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    cli.main(argv[1:])
    out = capsys.readouterr().out
    assert "4,096 rows, 200 steps (max_steps), 128 rollouts judged per generation batch (8 prompt(s) × 16)" in out
    assert "whole run (200 steps)" in out and "LiteLLM's price table for gemini/gemini-2.5-flash-lite" in out


@pytest.mark.parametrize("flag,value", [("--assume-latency-s", "inf"), ("--assume-latency-s", "nan"),
                                        ("--assume-judge-completion-tokens", str(10**30)),
                                        ("--assume-judge-completion-tokens", "-1")])
def test_assumptions_out_of_range_are_one_line_naming_the_flag(tmp_path, capsys, flag, value):
    """Issue 41: `--assume-latency-s inf` was a traceback and 10^30 answer tokens were accepted."""
    data = _write(tmp_path / "raw.jsonl", [{"question": "1+1?", "solution": "So \\boxed{2}."}])
    with pytest.raises(SystemExit) as exited:
        cli.main(["estimate", "prepare", "--dataset", data, "--problem-column", "question", "--reference-column",
                  "solution", "--judge-model", "openai/x", "--out", str(tmp_path / "out"), flag, value])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "Traceback" not in err
    assert f"--{flag.lstrip('-').replace('-', '_')} must be" in err


def test_a_rows_two_requests_wait_for_each_other():
    """Issue 44: `estimate prepare`'s wall time ignored that a row's graph request waits for its points answer: with
    ample concurrency one row still takes two latencies."""
    from ppm_trl.judge import projection

    profile = projection.RequestProfile(2.0, 1000.0, 100.0)
    limits = projection.JudgeLimits(None, None, 64, 3.0)
    unpriced = projection.Prices(None, None)
    assert projection.batch_workload(1, profile, limits, unpriced).seconds == 3.0  # 2 requests, one wave
    assert projection.batch_workload(1, profile, limits, unpriced, chained=2).seconds == 6.0
    assert projection.batch_workload(100, profile, limits, unpriced, chained=2).seconds == 12.0  # 200 / 64 → 4 waves
