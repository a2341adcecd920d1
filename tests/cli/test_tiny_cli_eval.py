"""Foundation: offline tiny model, config parsing, `ppm-trl train` (GRPO), pass@k, bad-input errors."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from itertools import combinations

import pytest
import torch
import yaml

from ppm_trl.evaluate import parse_eval_args
from ppm_trl.evaluation import pass_at_k, summarize
from ppm_trl.flags import UsageError
from ppm_trl.tiny import build_tiny_model_and_tokenizer


def test_tiny_round_trip(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = build_tiny_model_and_tokenizer(seed=3)
    text = "P1: (9*2+6)*2 = 48\n\\boxed{48} ü"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    loaded_tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    ids = torch.tensor([loaded_tokenizer("abc", add_special_tokens=False)["input_ids"]])
    assert torch.allclose(model(ids).logits, loaded(ids).logits)
    assert loaded.config.model_type == "qwen2"
    # Deterministic in the seed, different across seeds.
    again, _ = build_tiny_model_and_tokenizer(seed=3)
    other, _ = build_tiny_model_and_tokenizer(seed=4)
    assert torch.equal(model.model.embed_tokens.weight, again.model.embed_tokens.weight)
    assert not torch.equal(model.model.embed_tokens.weight, other.model.embed_tokens.weight)


def _brute_pass_at_k(n, c, k):
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(combinations(range(n), k))
    return sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n,c,k", [(8, 0, 1), (8, 1, 1), (8, 3, 2), (8, 3, 8), (10, 7, 4), (5, 5, 3)])
def test_pass_at_k_is_the_unbiased_estimator(n, c, k):
    assert math.isclose(pass_at_k(n, c, k), _brute_pass_at_k(n, c, k), abs_tol=1e-12)
    assert math.isclose(pass_at_k(n, c, k), 1 - math.comb(n - c, k) / math.comb(n, k), abs_tol=1e-12)


def test_summarize_and_bad_k():
    metrics = summarize([[True, False, False, False], [False] * 4], ks=[1, 4])
    assert metrics == {"pass@1": 0.125, "pass@4": 0.5, "avg@4": 0.125}
    with pytest.raises(ValueError, match="k"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match=r"k <= the 4 samples per problem; got k = \[8\]"):  # was silently dropped
        summarize([[True, False, False, False]], ks=[1, 8])


def test_eval_k_larger_than_num_samples_is_a_usage_error(capsys):
    from ppm_trl import cli

    with pytest.raises(SystemExit) as error:  # before any model is loaded: the model path does not exist
        cli.main(["eval", "--model", "/nonexistent", "--env", "multi_countdown", "--num_samples", "4", "--k", "1", "8"])
    assert error.value.code == 2
    err = capsys.readouterr().err
    assert "--k 8: pass@k needs 1 <= k <= num_samples (4)" in err and "Traceback" not in err


def _run_cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "ppm_trl.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def _config(tmp_path, **overrides):
    config = {
        "method": "grpo", "model_name_or_path": "tiny", "env_name": "multi_countdown", "env_n": 2, "env_size": 8,
        "output_dir": str(tmp_path / "out"), "use_cpu": True, "bf16": False, "gradient_checkpointing": False,
        "per_device_train_batch_size": 8, "num_generations": 4, "max_completion_length": 24, "max_steps": 2,
        "logging_steps": 1, "save_strategy": "no", "report_to": "none", "seed": 0, **overrides,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_cli_train_grpo_two_steps_then_eval(tmp_path):
    result = _run_cli("train", "--config", str(_config(tmp_path)))
    assert result.returncode == 0, result.stderr[-3000:]
    done = next(line for line in result.stdout.splitlines() if line.startswith("ppm-trl train: done"))
    summary = json.loads(done.split("done ", 1)[1])
    assert summary["steps"] == 2 and summary["method"] == "grpo"
    assert (tmp_path / "out" / "config.json").exists()  # a checkpoint loadable with from_pretrained
    # A picture of the run beside the model, named by the done line.
    assert summary["training_curves"] == str(tmp_path / "out" / "training_curves.png")
    assert (tmp_path / "out" / "training_curves.png").read_bytes()[:4] == b"\x89PNG"
    # A quiet run: none of the third-party lines a user cannot act on (ppm_trl.quiet).
    for noise in ("is deprecated", "Setting accelerator to CPU", "Loading weights", "Writing model shards", "Map:"):
        assert noise not in result.stderr + result.stdout, noise
    result = _run_cli("eval", "--model", str(tmp_path / "out"), "--env", "multi_countdown", "--env_n", "1",
                      "--env_size", "2", "--num_samples", "2", "--k", "1", "2", "--max_new_tokens", "8",
                      "--output", str(tmp_path / "eval.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    written = json.loads((tmp_path / "eval.json").read_text())
    assert set(written["metrics"]) == {"pass@1", "pass@2", "avg@2"}
    printed = json.loads(result.stdout.strip().splitlines()[-1].split("ppm-trl eval: ", 1)[1])
    assert printed["problems"] == 2 and printed["samples_per_problem"] == 2
    assert printed["dataset"] == "env 'multi_countdown'" and printed["pass@2"] == written["metrics"]["pass@2"]
    assert "sampling" in result.stderr  # the progress bar
    (first, second) = written["per_problem"]
    assert len(first["completions"]) == 2 and len(first["correct"]) == 2 and first["prompt"]


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"env_name": "sudoku"}, "unknown env"),
        ({"env_n": 0}, "n"),
        ({"method": "dpo"}, "unknown method"),
        ({"model_name_or_path": "./does/not/exist"}, "does not exist"),
        ({"no_such_key": 1}, "no_such_key"),
        ({"reward_funcs": ["telepathy"]}, "unknown reward function"),
    ],
)
def test_cli_bad_input_names_the_problem(tmp_path, overrides, message, capsys):
    from ppm_trl import cli

    with pytest.raises(SystemExit) as error:
        cli.main(["train", "--config", str(_config(tmp_path, **overrides))])
    assert error.value.code == 2  # a usage error
    err = capsys.readouterr().err
    assert err.startswith("ppm-trl train: error: ") and message in err and "Traceback" not in err


def test_config_fields_are_flags_and_validated():
    from trl import TrlParser

    from ppm_trl.papo.papo_config import PAPOConfig
    from ppm_trl.ppm.ppm_config import PPMConfig

    (config,) = TrlParser((PPMConfig,)).parse_args_and_config(
        ["--output_dir", "/tmp/x", "--use_cpu", "true", "--num_segments", "8", "--granularity", "trajectory",
         "--per_device_train_batch_size", "16"])
    assert config.num_segments == 8 and config.granularity == "trajectory"
    assert config.scale_rewards == "none" and config.epsilon_high == 0.28 and config.learning_rate == 3e-6
    with pytest.raises(ValueError, match="granularity"):
        PPMConfig(output_dir="/tmp/x", use_cpu=True, per_device_train_batch_size=16, granularity="token")
    with pytest.raises(ValueError, match="combine"):
        PAPOConfig(output_dir="/tmp/x", use_cpu=True, combine="additive")


def test_eval_arguments_from_yaml_and_flags(tmp_path):

    config = tmp_path / "eval.yaml"
    config.write_text("model: outputs/x\ndataset_name: gsm8k_test.jsonl\nproblem_column: question\nk: [1, 4]\n"
                      "num_samples: 4\n")
    args = parse_eval_args(["--config", str(config), "--num_samples", "8", "--k", "1", "8"])
    assert (args.model, args.problem_column, args.num_samples, args.k) == ("outputs/x", "question", 8, [1, 8])
    with pytest.raises(UsageError, match="no_such_key"):
        config.write_text("model: x\nenv_name: multi_countdown\nno_such_key: 1\n")
        parse_eval_args(["--config", str(config)])
    with pytest.raises(UsageError, match="give --env NAME"):
        parse_eval_args(["--model", "x"])


class _RunsCode:
    """A pickle that would run a command when loaded without `weights_only`."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_eval_of_a_model_whose_pickle_weights_hold_code_is_one_line_and_runs_nothing(tmp_path, capsys):
    """Issue 41: a pickle pytorch_model.bin that is not just tensors was a traceback (weights_only refused it)."""
    from ppm_trl import cli

    model, tokenizer = build_tiny_model_and_tokenizer()
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "ran"
    torch.save({"model.embed_tokens.weight": _RunsCode(marker)}, folder / "pytorch_model.bin")
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n")
    with pytest.raises(SystemExit) as exited:
        cli.main(["eval", "--model", str(folder), "--dataset_name", str(data), "--num_samples", "1", "--k", "1"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "Traceback" not in err and not marker.exists()
    assert f"--model {folder}: its weights could not be loaded (UnpicklingError)" in err
    assert "weights_only=False" not in err and "weights_only` set to `False" not in err


def test_kl_to_start_is_the_k3_estimate_on_the_sampled_tokens():
    """`mean_token_kl` (issue 40 item 4: KL to the starting policy at each evidence evaluation): 0 against itself,
    and against another policy the mean over the completion tokens of exp(d) − d − 1, d = log π0 − log π, computed
    here from two plain forwards of each prompt + completion."""
    from ppm_trl.evaluation import mean_token_kl

    model, tokenizer = build_tiny_model_and_tokenizer(seed=0)
    start, _ = build_tiny_model_and_tokenizer(seed=1)
    prompts = [[{"role": "user", "content": "What is 3+4?"}], "plain prompt: 2+2="]
    completions = ["It is 7.", "4, and a longer answer"]
    assert mean_token_kl(model, model, tokenizer, prompts, completions) == 0.0
    terms = []
    for prompt, completion in zip(prompts, completions):
        text = prompt if isinstance(prompt, str) else tokenizer.apply_chat_template(
            prompt, tokenize=False, add_generation_prompt=True)
        head = tokenizer(text, add_special_tokens=False)["input_ids"]
        tail = tokenizer(completion, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            now, then = (torch.log_softmax(m(torch.tensor([head + tail])).logits[0].double(), -1) for m in (model, start))
        for j, token in enumerate(tail):
            d = (then[len(head) + j - 1, token] - now[len(head) + j - 1, token]).item()
            terms.append(math.exp(d) - d - 1)
    kl = mean_token_kl(model, start, tokenizer, prompts, completions, batch_size=1)
    assert kl == pytest.approx(sum(terms) / len(terms), rel=1e-6) and kl > 0
    assert mean_token_kl(model, start, tokenizer, prompts, completions, batch_size=2) == pytest.approx(kl, rel=1e-6)
    assert model.training and start.training  # modes restored
