"""Environment-owned data (no `train_dataset`: TRL builds `prompt`-only rows from the environment's `reset()`), and
the order of the checks at construction: GRPOTrainer's own argument checks first (their messages stay TRL's), then
what a method refuses of what TRL accepts — ARG's multi-turn refusal, PPM's and PAPO's built-in scorers that read a
dataset column the environment's rows do not have, VeriFree's and OPSD's reference."""

from __future__ import annotations

import os

import pytest
import torch
from helpers import TINY_ARGS, capture_outputs, script_generation

from ppm_trl.tiny import build_tiny_model_and_tokenizer

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
G = 3


class WordEnvironment:
    """The environment owns the data: `reset()` returns the prompt."""

    def reset(self, **kwargs):
        return "Say done."


def length_reward(completions, **kwargs):
    return [float(len(c[-1]["content"] if isinstance(c, list) else c)) for c in completions]


def _build(method, tmp_path, environment=WordEnvironment, train_dataset=None, reward_funcs=length_reward, **kwargs):
    from ppm_trl.registry import get_method

    config_fields = {key: kwargs.pop(key) for key in list(kwargs)  # a scorer's name is the config's; a callable not
                     if key not in ("progress_scorer", "process_scorer") or isinstance(kwargs[key], str)}
    method = get_method(method)
    args = method.config_class()(output_dir=str(tmp_path), per_device_train_batch_size=G, num_generations=G,
                                 max_completion_length=16, **{**TINY_ARGS, **config_fields})
    model, tokenizer = build_tiny_model_and_tokenizer(tool_calling=True)
    extra = {"environment_factory": environment} if environment is not None else {}
    return method.trainer_class()(model=model, processing_class=tokenizer, reward_funcs=reward_funcs, args=args,
                                  train_dataset=train_dataset, **extra, **kwargs)


@pytest.mark.parametrize("method, scorer, column, argument", [
    ("ppm", {}, "reasoning_points", "progress_scorer"),
    ("ppm", {"progress_scorer": "judge", "judge_model": "openai/x"}, "reasoning_points", "progress_scorer"),
    ("papo", {}, "reasoning_points", "process_scorer"),
    ("papo", {"process_scorer": "judge", "judge_model": "openai/x"}, "reference", "process_scorer"),
])
def test_builtin_scorer_refused_with_environment_owned_data(tmp_path, method, scorer, column, argument):
    """Refused when built (not at the first step), naming the column, the scorer and the scorer argument."""
    name = scorer.get(argument, "programmatic")
    with pytest.raises(ValueError) as error:
        _build(method, tmp_path, max_steps=1, **scorer)
    message = str(error.value)
    assert f"`{column}`" in message and f"the `{name}` {argument.split('_')[0]} scorer" in message
    assert f"`{argument}=`" in message and "environment owns the data" in message


@pytest.mark.parametrize("method, reader", [("verifree", "VeriFree's reference-answer likelihood"),
                                             ("opsd", "OPSD's teacher")])
def test_a_method_that_reads_the_reference_itself_is_refused_with_environment_owned_data(tmp_path, method, reader):
    """No scorer can stand in for VeriFree's reference answer or OPSD's teacher context: the way out is a dataset."""
    with pytest.raises(ValueError) as error:
        _build(method, tmp_path, max_steps=1)
    message = str(error.value)
    assert message.startswith(f"{method.upper()}: the environment owns the data (no `train_dataset`)")
    assert f"no `reference` column, which {reader}" in message and "Pass a `train_dataset` with `reference`" in message
    assert "scorer" not in message


@pytest.mark.parametrize("method", ["ppm", "papo", "arg", "ppm+arg", "papo+arg", "verifree", "opsd"])
def test_trl_checks_come_first(tmp_path, method):
    """GRPOTrainer's own messages, whatever the method (ARG's reference check and multi-turn refusal, PPM's and
    PAPO's scorer refusals come after them)."""
    with pytest.raises(ValueError, match="No reward source provided"):
        _build(method, tmp_path, environment=None, reward_funcs=None, train_dataset=_one_row_dataset())
    with pytest.raises(ValueError, match="`train_dataset` is required"):
        _build(method, tmp_path, environment=None)
    with pytest.raises(ValueError, match="max_steps"):  # environment-owned data without max_steps
        _build(method, tmp_path)
    with pytest.raises(ValueError, match="requires a `train_dataset`"):
        _build(method, tmp_path, environment={"a": WordEnvironment, "b": WordEnvironment}, max_steps=1)


@pytest.mark.parametrize("method", ["arg", "ppm+arg", "papo+arg"])
def test_arg_refuses_environments_after_trl_checks(tmp_path, method):
    scorers = {"ppm+arg": {"progress_scorer": lambda rows, texts: [[1.0]] * len(rows)},
               "papo+arg": {"process_scorer": lambda rows, texts: [1.0] * len(rows)}}.get(method, {})
    with pytest.raises(ValueError, match="`environment_factory` is not supported .*PPMGRPOTrainer"):
        _build(method, tmp_path, max_steps=1, **scorers)


def _one_row_dataset():
    from ppm_trl.envs import make_dataset

    return make_dataset("multi_add", n=2, size=3, seed=0)


def test_ppm_trains_on_environment_owned_data_with_its_own_scorer(tmp_path):
    """The alternative the refusal names: a progress scorer that reads the completions only."""
    seen = []

    def progress(rows, texts):  # texts: each row's K prefixes; progress = share of 'done' words said, of 2
        seen.append([dict(row) for row in rows])
        return [[min(prefix.count("done"), 2) / 2 for prefix in prefixes] for prefixes in texts]

    trainer = _build("ppm", tmp_path, max_steps=1, progress_scorer=progress, num_segments=2,
                     segmentation="equal_chunks")
    script_generation(trainer, lambda prompt, i: ["x x x x", "done x x x", "done done x x"][i % G])
    outputs = capture_outputs(trainer)
    trainer.train()

    assert seen and all(set(row) == {"prompt"} for rows in seen for row in rows)  # TRL's placeholder rows
    advantages = outputs[0]["advantages"]
    mask = outputs[0]["completion_mask"].bool()
    per_row = [advantages[i][mask[i]] for i in range(G)]
    assert per_row[0].max() < 0 < per_row[2].max()  # more progress, higher advantage
    assert torch.isfinite(advantages).all()


@pytest.mark.parametrize("method, scorer_argument", [("ppm", "progress_scorer"), ("papo", "process_scorer")])
def test_own_scorer_needs_no_dataset_column(tmp_path, method, scorer_argument):
    """With its own scorer a method reads no column: a dataset of environment names only (a dict
    `environment_factory` routes each row) builds; the built-in scorer's column is asked for without one."""
    from datasets import Dataset

    routed = Dataset.from_dict({"environment": ["words", "words", "words"]})
    environments = {"words": WordEnvironment}

    def own_scorer(rows, texts):
        return [[0.0] * len(prefixes) for prefixes in texts] if method == "ppm" else [0.0] * len(texts)

    trainer = _build(method, tmp_path, environment=environments, train_dataset=routed, max_steps=1,
                     **{scorer_argument: own_scorer})
    assert getattr(trainer, scorer_argument) is own_scorer
    with pytest.raises(ValueError, match="reasoning_points"):
        _build(method, tmp_path, environment=environments, train_dataset=routed, max_steps=1)
