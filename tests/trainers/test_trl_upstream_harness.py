"""The harness that runs TRL's own GRPO tests against our trainers (tests/trl_upstream, `make test-trl-upstream`):
the README tables it checks, its refusal verdicts, the trainer swap and the offline stand-ins. Fast; TRL's tests
themselves run in their own target, not in `make test`."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = ROOT / "tests" / "trl_upstream" / "test_grpo_trainer.py"


@pytest.fixture(scope="module")
def harness():
    from trl_upstream import harness

    return harness


def _upstream_names() -> tuple[set[str], set[str]]:
    tree = ast.parse(UPSTREAM.read_text(encoding="utf-8"))
    classes = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    tests = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}
    return classes, tests


def test_every_readme_row_names_a_test_of_trls_file(harness):
    refusals, not_run = harness.readme_tables()
    classes, tests = _upstream_names()
    assert len(refusals) >= 10 and len(not_run) >= 5
    for row in [*refusals, *not_run]:
        cls, _, name = row.test.rpartition("::")
        base = name.split("[")[0]
        assert (base in tests or (base == "*" and cls in classes)), f"README row names no test of TRL's file: {row}"
        assert not cls or cls in classes, row
        assert row.trainers and set(row.trainers) <= set(harness.METHODS), row
    for row in refusals:
        assert row.option and row.alternative and row.reason, row


def test_every_refusal_message_fragment_is_in_our_code(harness):
    """The option and alternative each README row expects are words of a message our code raises (the upstream run
    checks the actual message; this catches a reworded message in `make test`)."""
    source = "\n".join(path.read_text(encoding="utf-8") for path in (ROOT / "ppm_trl").rglob("*.py"))
    refusals, _ = harness.readme_tables()
    for row in refusals:
        for fragment in (row.option, row.alternative):
            assert fragment in source, f"no message of ppm_trl names {fragment!r} (README row {row.test})"


def test_readme_tables_reject_malformed_rows(harness):
    good = ("\n## TRL's own GRPO tests\n\nExpected refusals\n\n| Test | Trainers | Option | Alternative | Why |\n"
            "|---|---|---|---|---|\n| `test_a[x]` | ppm, arg | `o` | `a` | r |\n\nNot run here\n\n"
            "| Test | Trainers | Marked | Why |\n|---|---|---|---|\n| `test_b` | all | skip | r |\n\n## Next\n")
    refusals, not_run = harness.readme_tables(good)
    assert refusals == [harness.Refusal("test_a[x]", ("ppm", "arg"), "o", "a", "r")]
    assert not_run == [harness.NotRun("test_b", harness.METHODS, "skip", "r")]
    with pytest.raises(ValueError, match="unknown trainer"):
        harness.readme_tables(good.replace("ppm, arg", "ppm, gspo"))
    with pytest.raises(ValueError, match="the option and the alternative"):
        harness.readme_tables(good.replace("| `o` | `a` |", "| `o` |  |"))
    with pytest.raises(ValueError, match="skip or xfail"):
        harness.readme_tables(good.replace("| skip |", "| maybe |"))
    with pytest.raises(ValueError, match="no \"Not run here\""):
        harness.readme_tables(good.split("Not run here")[0])


def test_a_listed_refusal_passes_only_when_refused_naming_option_and_alternative(harness):
    row = harness.Refusal("test_x", ("ppm",), "loss_type='luspo'", "granularity='trajectory'", "why")
    harness.judge_refusal(row, "ppm", ValueError("no loss_type='luspo' here. Use granularity='trajectory'."))
    with pytest.raises(AssertionError, match="does not name \\[\"granularity='trajectory'\"\\]"):
        harness.judge_refusal(row, "ppm", ValueError("loss_type='luspo' is not supported"))
    with pytest.raises(AssertionError, match="does not name"):
        harness.judge_refusal(row, "ppm", RuntimeError("CUDA out of memory"))
    with pytest.raises(pytest.fail.Exception, match="but it passed: the refusal is gone"):
        harness.judge_refusal(row, "ppm", None)


def test_patterns_match_literally_but_for_the_star(harness):
    assert harness._matches("test_x[luspo-*]", "TestGRPOTrainer::test_x[luspo-False]")
    assert harness._matches("TestGRPOTrainerVLM::*", "TestGRPOTrainerVLM::test_train_vlm[m]")
    assert not harness._matches("TestGRPOTrainerVLM::*", "TestGRPOTrainer::test_train_vlm[m]")
    assert not harness._matches("test_x[luspo-False]", "TestGRPOTrainer::test_x[vespo-False]")
    assert not harness._matches("test_x", "TestGRPOTrainer::test_x_y")
    assert not harness._matches("test_x[ab]", "test_x[a]")  # brackets are no character class


def test_core_selects_by_parameters_too(harness):
    assert harness.in_core("TestGRPOTrainer::test_train_loss_types[luspo-False]")
    assert not harness.in_core("TestGRPOTrainer::test_train_loss_types[bnpo-False]")
    assert harness.in_core("TestGRPOTrainer::test_init_minimal")
    assert not harness.in_core("TestGRPOTrainer::test_train_with_eval")


def test_upstream_name_drops_only_our_trainer_id(harness):
    def item(name, method):
        return SimpleNamespace(name=name, callspec=SimpleNamespace(params={"trl_method": method}),
                               cls=SimpleNamespace(__name__="TestGRPOTrainer"))

    assert harness.upstream_name(item("test_a[ppm-luspo-False]", "ppm")) == "TestGRPOTrainer::test_a[luspo-False]"
    assert harness.upstream_name(item("test_a[ppm+arg]", "ppm+arg")) == "TestGRPOTrainer::test_a"
    assert (harness.upstream_name(item("test_train[arg-trl-internal-testing/tiny-Qwen3MoeForCausalLM]", "arg"))
            == "TestGRPOTrainer::test_train[trl-internal-testing/tiny-Qwen3MoeForCausalLM]")


def test_the_full_file_runs_for_one_trainer_chosen_by_the_commit(harness, monkeypatch):
    monkeypatch.delenv("TRL_UPSTREAM_FULL", raising=False)
    methods = ["ppm", "papo", "arg"]
    chosen = harness.full_method(methods)
    assert chosen in methods and harness.full_method(methods) == chosen
    monkeypatch.setenv("TRL_UPSTREAM_FULL", "papo+arg")
    assert harness.full_method(methods) == "papo+arg"
    monkeypatch.setenv("TRL_UPSTREAM_FULL", "gspo")
    with pytest.raises(pytest.UsageError, match="TRL_UPSTREAM_FULL"):
        harness.full_method(methods)
    monkeypatch.setenv("TRL_UPSTREAM_METHODS", "ppm,dpo")
    with pytest.raises(pytest.UsageError, match="unknown trainer"):
        harness.selected_methods()


def test_configs_keep_trls_defaults_and_the_methods_own(harness):
    from trl import GRPOConfig

    from ppm_trl import ARGTrainer, PAPOConfig, PPMConfig, PPMGRPOTrainer

    trainer, config = harness._trainer_and_config("ppm")
    assert issubclass(trainer, PPMGRPOTrainer) and trainer.__name__ == "PPMGRPOTrainer"
    args = config(output_dir="out", report_to="none")
    trl = GRPOConfig(output_dir="out", report_to="none", bf16=False)
    assert type(args) is PPMConfig
    for name in ("num_generations", "learning_rate", "epsilon_high", "scale_rewards", "mask_truncated_completions",
                 "gradient_accumulation_steps"):
        assert getattr(args, name) == getattr(trl, name), name  # PPM's paper defaults give way to TRL's
    assert (args.granularity, args.num_segments, args.progress_scorer) == ("segment", 4, "programmatic")
    assert config(output_dir="out", learning_rate=0.1, num_generations=3, per_device_train_batch_size=3).learning_rate == 0.1
    papo = harness._trainer_and_config("papo")[1](output_dir="out")
    assert type(papo) is PAPOConfig and papo.correct_threshold == float("-inf")
    arg_trainer, arg_config = harness._trainer_and_config("arg")
    assert issubclass(arg_trainer, ARGTrainer)
    assert arg_config(output_dir="out", max_completion_length=8).arg_min_continuation_tokens == 4
    assert arg_config(output_dir="out").arg_min_continuation_tokens == 16
    assert harness._trainer_and_config("grpo")[0].__name__ == "GRPOTrainer"


def test_text_scorers_give_signal_in_range():
    from trl_upstream.offline import TextProcess, TextProgress

    progress = TextProgress()([{}, {}], [["", "abcd", "abcd efgh", "abcdefghijklmnop"], ["x", "x", "x", "x"]])
    assert progress.flatten().tolist() == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0, 0.0, 0.0, 0.0, 0.0])
    scores = TextProcess()([{}, {}, {}, {}], ["I won't increment", "\nDone!", "abcd", ""])
    assert all(0 <= score < 1 for score in scores) and len(set(scores[:3])) == 3 and scores[3] == 0.0


def test_composed_trainers_get_both_text_scorers(harness):
    import inspect

    for method, scorers in (("ppm+arg", ("progress_scorer",)), ("papo+arg", ("process_scorer",)),
                            ("ppm", ("progress_scorer",)), ("papo", ("process_scorer",))):
        trainer = harness._trainer_and_config(method)[0]
        source = inspect.getclosurevars(trainer.__init__).nonlocals["scorers"]
        assert set(source) == set(scorers), method


def test_local_zen_has_zens_prompt_and_our_columns():
    from datasets import IterableDataset
    from trl_upstream.offline import ZEN_SPLITS, load_dataset

    standard = load_dataset("trl-internal-testing/zen", "standard_prompt_only")
    assert {split: len(rows) for split, rows in standard.items()} == {k: v["size"] for k, v in ZEN_SPLITS.items()}
    row = standard["train"][0]
    assert isinstance(row["prompt"], str) and row["prompt"].startswith("Add:")
    assert {"reference", "reasoning_points", "reasoning_graph", "env", "answer"} <= set(row)
    conversational = load_dataset("trl-internal-testing/zen", "conversational_prompt_only", split="test")
    assert conversational[0]["prompt"] == [{"role": "user", "content": standard["test"][0]["prompt"]}]
    assert isinstance(load_dataset("trl-internal-testing/zen", "standard_prompt_only", split="train",
                                   streaming=True), IterableDataset)
    with pytest.raises(pytest.skip.Exception, match="zen-image"):
        load_dataset("trl-internal-testing/zen-image", "conversational_prompt_only", split="train")


def test_tiny_ids_encode_the_scripted_texts():
    from trl_upstream.offline import TINY_EOS, TINY_PAD, tiny_ids

    from ppm_trl.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    ids = tiny_ids(["Done!<|im_end|>", "I won't<|im_end|>"])
    assert ids.shape == (2, 8) and ids[0, 5].item() == TINY_EOS and ids[0, -1].item() == TINY_PAD
    assert tokenizer.decode(ids[1].tolist(), skip_special_tokens=True) == "I won't"


def test_hub_ids_resolve_offline_to_the_tiny_models(tmp_path, monkeypatch):
    import huggingface_hub.constants
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
    from trl_upstream.offline import hub_cache

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", hub_cache(str(tmp_path)))
    model = AutoModelForCausalLM.from_pretrained("trl-internal-testing/tiny-Qwen2ForCausalLM-2.5")
    reward = AutoModelForSequenceClassification.from_pretrained(
        "trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5")
    tools = AutoTokenizer.from_pretrained("trl-internal-testing/tiny-Qwen3MoeForCausalLM")
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.config.hidden_size == 64
    assert type(reward).__name__ == "Qwen2ForSequenceClassification" and reward.config.num_labels == 1
    assert "tool_call" in tools.chat_template
    with pytest.raises(OSError):  # an id without a stand-in is not in the cache, and nothing goes to the network
        AutoModelForCausalLM.from_pretrained("trl-internal-testing/tiny-Gemma2ForCausalLM")


def test_make_test_leaves_trls_tests_to_their_own_target():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'norecursedirs = \[[^\]]*"trl_upstream"', pyproject)
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = makefile.split("\ntest-trl-upstream: install\n", 1)[1].split("\n\n", 1)[0]
    assert "-m pytest" in recipe and "tests/trl_upstream" in recipe
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "make test-trl-upstream\ncheck $? \"make test-trl-upstream\"" in ci
