"""The demo pipeline end to end in smoke size, the warm-start cache, and the success metrics' counting."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

import pytest

from ppm_trl.demo import RunSpec, main, warmstart
from ppm_trl.envs import make_dataset


def test_quick_demo_writes_results_plot_and_a_loadable_checkpoint(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "demo"
    summary = main(["--quick", "--output-dir", str(out), "--cache-dir", str(tmp_path / "cache")])
    assert summary["n"] == 2
    # Each trainer for each seed (default 0 and 1), two at a time in worker processes, in a fixed order.
    assert [(run["spec"]["variant"], run["spec"]["seed"]) for run in summary["runs"]] == [
        ("lines", 0), ("lines", 1), ("sparse", 0), ("sparse", 1)]
    for run in summary["runs"]:
        history = run["history"]
        # Step 0 (before training) plus one evaluation per step; samples = steps · 8 prompts · G = 8.
        assert [h["step"] for h in history] == [0, 1, 2]
        assert [h["samples"] for h in history] == [0, 64, 128]
        # An all-correct answer has every sub-problem right, so the rate can never exceed per-sub-problem accuracy.
        assert all(0.0 <= h["all_correct"] <= h["per_subproblem"] + 1e-9 <= 1.0 + 1e-9 for h in history)
        # The last evaluation keeps its completions (all 8 of the quick eval set: their verdicts are the rates).
        assert all("completions" not in h for h in history[:-1])
        for key, rate in (("completions", "all_correct"), ("greedy_completions", "greedy_all_correct")):
            kept = history[-1][key]
            assert len(kept) == 8 and all(isinstance(c["completion"], str) for c in kept)
            assert sum(c["correct"] for c in kept) / 8 == history[-1][rate]
            assert sum(len(c["points"]) for c in kept) / (8 * 2) == pytest.approx(
                history[-1]["per_subproblem" if key == "completions" else "greedy_per_subproblem"])
    printed = capsys.readouterr().out
    fingerprint = summary["warm_start_fingerprint"]
    assert f"fingerprint (weights sha256): {fingerprint}" in printed and f"warm start {fingerprint}" in printed
    assert "mean of 2: all-correct" in printed
    assert os.path.getsize(out / "success_vs_samples.png") > 1000
    saved = json.loads((out / "results.json").read_text())
    assert saved["n"] == 2 and saved["warm_start_fingerprint"] == fingerprint
    assert set(saved["profile"]) == {"1", "2"} and set(saved["horizon_reasons"]) == {"1", "2"}
    model = AutoModelForCausalLM.from_pretrained(out / "ppm_model")
    tokenizer = AutoTokenizer.from_pretrained(out / "ppm_model")
    assert model.config.hidden_size == 32 and tokenizer.eos_token == "<|im_end|>"


def test_runs_give_the_same_numbers_in_process_and_in_workers_with_other_thread_counts(tmp_path):
    """`train_variants` pins one thread and deterministic algorithms: a run in this process (4 threads asked) and
    the same runs in spawned workers give identical histories, so OMP_NUM_THREADS cannot change a result."""
    import torch

    from ppm_trl.demo import RunSpec, train_variants

    settings = warmstart.WarmStartSettings(horizons=(1, 2), num_examples=64, max_steps=2, batch_size=8,
                                           hidden_size=32, num_hidden_layers=1)
    path = warmstart.warm_start(settings, cache_root=str(tmp_path / "cache"), progress=False)
    eval_dataset = make_dataset("multi_add", 2, 8, seed=3)
    specs = [RunSpec(variant=v, n=2, max_steps=2, eval_every=1, learning_rate=1e-3) for v in ("lines", "sparse")]
    threads = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        alone = train_variants(path, specs, eval_dataset, str(tmp_path / "a"), workers=1)
        assert torch.get_num_threads() == 4  # restored
    finally:
        torch.set_num_threads(threads)
    parallel = train_variants(path, specs, eval_dataset, str(tmp_path / "b"), workers=2)
    for one, other in zip(alone, parallel):
        assert one["history"] == other["history"]
        assert [log.get("loss") for log in one["train_logs"]] == [log.get("loss") for log in other["train_logs"]]


def test_warm_start_is_cached_by_settings(tmp_path):
    settings = warmstart.WarmStartSettings(horizons=(1,), num_examples=8, max_steps=1, batch_size=4,
                                           hidden_size=32, num_hidden_layers=1)
    path = warmstart.warm_start(settings, cache_root=str(tmp_path), progress=False)
    stamp = os.path.getmtime(os.path.join(path, "warmstart.json"))
    assert warmstart.warm_start(settings, cache_root=str(tmp_path), progress=False) == path
    assert os.path.getmtime(os.path.join(path, "warmstart.json")) == stamp  # not retrained
    other = warmstart.WarmStartSettings(horizons=(1,), num_examples=8, max_steps=2, batch_size=4,
                                        hidden_size=32, num_hidden_layers=1)
    assert other.key() != settings.key()


def test_evaluate_policy_counts_all_correct_and_per_subproblem(monkeypatch):
    rows = make_dataset("multi_add", 2, 3, seed=0)
    references = rows["reference"]
    lines = [ref.split("\n") for ref in references]
    completions = [
        references[0],  # all correct
        lines[1][0] + "\nwrong\n" + lines[1][2],  # 1 of 2 lines right, no outcome
        references[2] + "\njunk",  # both lines right, outcome fails (termination)
    ]
    monkeypatch.setattr(warmstart, "sample_completions", lambda *args, **kwargs: [[text] for text in completions])
    metrics = warmstart.evaluate_policy(None, None, rows, max_new_tokens=8)
    assert metrics["all_correct"] == pytest.approx(1 / 3)
    assert metrics["per_subproblem"] == pytest.approx((1 + 0.5 + 1) / 3)
    assert metrics["per_point"] == pytest.approx([1.0, 2 / 3])  # line 1 right in all three, line 2 in rows 0 and 2


def test_the_one_sampler_is_seeded_leaves_the_run_alone_and_ignores_generation_config_top_k():
    """The demo's evaluation and `ppm-trl eval` sample through `evaluation.sample_completions`: the draws depend on
    the seed only, an evaluation inside training leaves the global RNG and train mode as they were, and a `top_k`
    in the model's generation config does not truncate the sampling behind the flags (vLLM does not apply it)."""
    import torch

    from ppm_trl.evaluation import sample_completions
    from ppm_trl.tiny import build_tiny_model_and_tokenizer

    assert warmstart.sample_completions is sample_completions  # no second copy in the demo
    model, tokenizer = build_tiny_model_and_tokenizer(seed=0, hidden_size=32, num_hidden_layers=1)
    prompts = [row["prompt"] for row in make_dataset("multi_add", 2, 4, seed=0).to_list()]
    model.train()
    rng_before = torch.random.get_rng_state()
    samples = sample_completions(model, tokenizer, prompts, 3, max_new_tokens=12, seed=5)
    assert torch.equal(torch.random.get_rng_state(), rng_before) and model.training
    assert [len(texts) for texts in samples] == [3, 3, 3, 3] and len({t for texts in samples for t in texts}) > 1
    model.generation_config.top_k = 1  # would make every draw greedy if it were applied
    assert sample_completions(model, tokenizer, prompts, 3, max_new_tokens=12, seed=5) == samples
    assert sample_completions(model, tokenizer, prompts, 3, max_new_tokens=12, seed=6) != samples


def test_python_dash_m_demo_parses_its_flags():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "ppm_trl.demo", "--help"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert "usage: python -m ppm_trl.demo" in result.stdout and "--quick" in result.stdout


def test_bad_settings_are_clear_errors():
    with pytest.raises(ValueError, match="variant"):
        RunSpec(variant="ppo")
    with pytest.raises(ValueError, match="horizons"):
        warmstart.WarmStartSettings(horizons=())
    with pytest.raises(ValueError, match="max_steps"):
        warmstart.WarmStartSettings(max_steps=0)


def test_env_recipes_apply_and_overrides_win():
    chain = warmstart.WarmStartSettings.for_env("chain_add")
    assert chain.env == "chain_add" and chain.learning_rate == 1e-3 and chain.max_steps == 1542
    assert warmstart.WarmStartSettings.for_env("multi_add_any_order").max_steps == 1000
    assert warmstart.WarmStartSettings.for_env("chain_add", learning_rate=3e-3).learning_rate == 3e-3
    assert warmstart.WarmStartSettings.for_env("multi_add") == warmstart.WarmStartSettings()  # no recipe: defaults
    assert chain.key() != warmstart.WarmStartSettings(env="chain_add").key()


def test_the_cache_key_is_the_recipe_its_version_and_the_pinned_kernels(monkeypatch):
    from ppm_trl.demo.kernels import PINNED_KERNELS

    settings = warmstart.WarmStartSettings()
    digest = hashlib.sha256(json.dumps({"version": warmstart.WARMSTART_VERSION, "kernels": PINNED_KERNELS,
                                        **dataclasses.asdict(settings)}, sort_keys=True).encode())
    assert settings.key() == digest.hexdigest()[:16]
    key = settings.key()
    monkeypatch.setattr(warmstart, "PINNED_KERNELS", {**PINNED_KERNELS, "MKL_CBWR": "AVX2,STRICT"})
    assert settings.key() != key  # another pin is another checkpoint
    assert warmstart.WarmStartSettings(max_steps=settings.max_steps + 1).key() != settings.key()
    assert not hasattr(settings, "target_per_subproblem")  # no accuracy-dependent stop: the step count is the recipe


_BUILD = """
import json, sys, torch
from ppm_trl.demo import warmstart
settings = warmstart.WarmStartSettings(horizons=(1, 2), num_examples=96, max_steps=12, batch_size=8,
                                       hidden_size=32, num_hidden_layers=1)
path = warmstart.warm_start(settings, cache_root=sys.argv[1], progress=False)
print(json.dumps({"digest": warmstart.read_manifest(path)["weights_digest"], "threads": torch.get_num_threads()}))
"""


def test_two_builds_in_separate_processes_with_1_and_2_threads_have_one_fingerprint(tmp_path):
    import subprocess
    import sys

    seen = []
    for threads in ("1", "2"):
        env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        done = subprocess.run([sys.executable, "-c", _BUILD, str(tmp_path / f"cache{threads}")], env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        seen.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert [s["threads"] for s in seen] == [1, 2]  # the processes really ran with different thread counts
    assert seen[0]["digest"] == seen[1]["digest"] and len(seen[0]["digest"]) == 16


_BUILD_COUNTED = """
import json, sys
from ppm_trl.demo import warmstart
build = warmstart.build_warm_start
warmstart.build_warm_start = lambda *args, **kwargs: (print("building", flush=True), build(*args, **kwargs))
settings = warmstart.WarmStartSettings(horizons=(1,), num_examples=64, max_steps=40, batch_size=4,
                                       hidden_size=32, num_hidden_layers=1)
print(json.dumps({"path": warmstart.warm_start(settings, cache_root=sys.argv[1], progress=False)}))
"""


def test_two_processes_asking_for_one_warm_start_at_once_build_it_once(tmp_path):
    """Two test workers (or two launches) wanting one uncached checkpoint: one builds, the other waits and reads it.
    Without the lock both build into one staging directory and one of them fails or both build."""
    import subprocess
    import sys

    from ppm_trl.demo.kernels import pinned_environ

    env = pinned_environ()  # the build then runs in each process itself, where the counter sees it
    children = [subprocess.Popen([sys.executable, "-c", _BUILD_COUNTED, str(tmp_path)], env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outputs = [child.communicate(timeout=1200) for child in children]
    assert [child.returncode for child in children] == [0, 0], [err[-2000:] for _, err in outputs]
    assert sum(out.count("building") for out, _ in outputs) == 1, outputs
    paths = {json.loads(out.strip().splitlines()[-1])["path"] for out, _ in outputs}
    assert len(paths) == 1 and warmstart.read_manifest(paths.pop())["steps_trained"] == 40
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]  # no staging left


def test_a_cached_checkpoint_whose_weights_changed_is_rebuilt(tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    settings = warmstart.WarmStartSettings(horizons=(1,), num_examples=16, max_steps=2, batch_size=4,
                                           hidden_size=32, num_hidden_layers=1)
    path = warmstart.warm_start(settings, cache_root=str(tmp_path), progress=False)
    digest = warmstart.read_manifest(path)["weights_digest"]
    assert warmstart.weights_digest(path) == digest
    weights = os.path.join(path, "model.safetensors")
    tensors = load_file(weights)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1e-3  # a partial copy, an edit, another code version's build under one key
    save_file(tensors, weights, metadata={"format": "pt"})
    assert warmstart.weights_digest(path) != digest
    assert warmstart.warm_start(settings, cache_root=str(tmp_path), progress=False) == path
    assert "rebuilding it" in capsys.readouterr().out
    assert warmstart.weights_digest(path) == digest == warmstart.read_manifest(path)["weights_digest"]


def test_a_build_that_differs_from_the_reference_machine_is_reported(tmp_path, monkeypatch):
    settings = warmstart.WarmStartSettings(horizons=(1,), num_examples=8, max_steps=1, batch_size=4,
                                           hidden_size=32, num_hidden_layers=1)
    path = warmstart.warm_start(settings, cache_root=str(tmp_path), progress=False)
    built = warmstart.read_manifest(path)["weights_digest"]
    monkeypatch.setattr(warmstart, "REFERENCE_DIGESTS", {settings.key(): built})
    assert warmstart.reference_check(settings, path) is None
    monkeypatch.setattr(warmstart, "REFERENCE_DIGESTS", {settings.key(): "0123456789abcdef"})
    message = warmstart.reference_check(settings, path)
    assert built in message and "0123456789abcdef" in message


def test_sft_labels_mask_the_prompt_and_keep_the_end_of_turn():
    from ppm_trl.tiny import build_tiny_model_and_tokenizer

    _, tokenizer = build_tiny_model_and_tokenizer(hidden_size=32, num_hidden_layers=1)
    row = warmstart.sft_dataset(warmstart.WarmStartSettings(horizons=(2,), num_examples=1))[0]
    tokens = warmstart.completion_only_tokens(tokenizer, row["prompt"], row["completion"])
    assert len(tokens["input_ids"]) == len(tokens["labels"])
    learned = [i for i, label in zip(tokens["input_ids"], tokens["labels"]) if label != -100]
    assert tokenizer.decode(learned) == row["completion"][0]["content"] + tokenizer.eos_token
    prompt_part = tokens["input_ids"][: len(tokens["input_ids"]) - len(learned)]
    assert tokenizer.decode(prompt_part).endswith("<|im_start|>assistant\n")


def test_demo_arguments_from_flags_and_yaml(tmp_path):
    from ppm_trl.demo import DemoArguments, parse_args

    config = tmp_path / "demo.yaml"
    config.write_text("steps: 5\nhorizons: [2, 3]\nquick: true\n")
    args = parse_args(["--config", str(config), "--eval-every", "2", "--output_dir", str(tmp_path / "o")])
    assert isinstance(args, DemoArguments)
    assert (args.steps, args.horizons, args.quick, args.eval_every) == (5, [2, 3], True, 2)  # flags over YAML
    assert args.output_dir == str(tmp_path / "o") and args.n is None
    with pytest.raises(ValueError, match="--steps must be >= 1, got 0"):
        parse_args(["--steps", "0"])
    with pytest.raises(ValueError, match="no_such_key"):
        config.write_text("no_such_key: 1\n")
        parse_args(["--config", str(config)])


def test_line_errors_make_wrong_but_self_consistent_references_at_the_asked_rate():
    import random
    import re

    from ppm_trl.envs import get_env

    rows = make_dataset("multi_add", 6, 400, seed=1)
    rng = random.Random(0)
    wrong = total = 0
    for row in rows:
        noisy = warmstart.with_line_errors(row["reference"], 0.4, rng)
        lines = noisy.split("\n")
        sums = {}
        for line, clean in zip(lines[:-1], row["reference"].split("\n")[:-1]):
            label, a, b, s = re.match(r"([a-z]):(\d+)\+(\d+)=(\d+)$", line).groups()
            assert clean.startswith(f"{label}:{a}+{b}=")  # only the sum changes
            assert abs(int(s) - (int(a) + int(b))) <= 1 and int(s) >= 0
            wrong += int(s) != int(a) + int(b)
            total += 1
            sums[label] = int(s)
        assert lines[-1] == "\\boxed{" + ",".join(f"{k}={v}" for k, v in sorted(sums.items())) + "}"
        assert get_env("multi_add").verify(row, noisy) == (noisy == row["reference"])
    assert abs(wrong / total - 0.4) < 0.03
    assert warmstart.with_line_errors(rows[0]["reference"], 0.0, rng) == rows[0]["reference"]


def test_line_error_rate_is_validated_and_enters_the_cache_key():
    with pytest.raises(ValueError, match=r"probability in \[0, 1\)"):
        warmstart.WarmStartSettings(line_error_rate=1.0)
    with pytest.raises(ValueError, match="not 'chain_add'"):
        warmstart.WarmStartSettings(env="chain_add", line_error_rate=0.1)
    assert warmstart.WarmStartSettings(line_error_rate=0.1).key() != warmstart.WarmStartSettings(
        line_error_rate=0.2).key()


def test_every_recipe_of_the_reference_table_is_a_current_cache_key():
    """REFERENCE_DIGESTS is keyed by the recipes' current cache keys (the key hashes the recipe version and the
    pinned kernels): a change of either that leaves the table stale fails here, not silently on a user's machine."""
    recipes = {warmstart.WarmStartSettings.for_env(env, seed=seed).key(): (env, seed)
               for env, seed in (("multi_add", 0), ("multi_add", 1), ("multi_add_any_order", 0),
                                 ("multi_add_boxed", 0))}
    assert set(warmstart.REFERENCE_DIGESTS) == set(recipes)


def test_an_interrupted_warm_start_build_leaves_nothing_in_the_cache(tmp_path, monkeypatch):
    """Issue 44: Ctrl-C in the Quickstart's warm start left a `.tmp` folder in ~/.cache/ppm_trl (and a traceback)."""
    import transformers

    from ppm_trl.demo.warmstart import WarmStartSettings, build_warm_start

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(transformers.Trainer, "train", interrupted)
    settings = WarmStartSettings(env="multi_add", horizons=(1,), num_examples=8, max_steps=1, batch_size=4,
                                 hidden_size=32, num_hidden_layers=1)
    path = tmp_path / "cache" / settings.key()
    with pytest.raises(KeyboardInterrupt):
        build_warm_start(settings, str(path), progress=False)
    assert not path.exists() and not (tmp_path / "cache" / f"{settings.key()}.tmp").exists()
