"""The contract with TRL: every private TRL member `ppm_trl/trainers/base.py` uses exists with the parameters it
passes, the rollout tuple has the order `Rollout` names, no other module names a TRL private member, and an
unsupported TRL is refused at import."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
import transformers
import trl
from helpers import TINY_ARGS
from trl import GRPOConfig, GRPOTrainer

from ppm_trl.tiny import build_tiny_model_and_tokenizer
from ppm_trl.trainers import base

PACKAGE = Path(base.__file__).resolve().parents[1]
SUPPORTED = (f"ppm_trl's base trainer supports trl{base.TRL_SUPPORTED}; installed: trl {trl.__version__}, "
             f"transformers {transformers.__version__}")
# TRL's documented class attributes for a subclass's model card (every TRL trainer sets them): not internals.
MODEL_CARD_ATTRIBUTES = {"_tag_names", "_name", "_paper"}


@pytest.fixture(scope="module")
def plain_trainer(tmp_path_factory):
    from datasets import Dataset

    model, tokenizer = build_tiny_model_and_tokenizer()
    args = GRPOConfig(output_dir=str(tmp_path_factory.mktemp("seam")), per_device_train_batch_size=2,
                      num_generations=2, max_completion_length=8, **TINY_ARGS)
    return GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=lambda completions, **kw: [0.0] * len(
        completions), args=args, train_dataset=Dataset.from_dict({"prompt": ["a", "b"]}))


@pytest.mark.parametrize("name", sorted(base.TRL_PRIVATE_METHODS))
def test_private_method_signatures(name):
    member = getattr(GRPOTrainer, name, None)
    assert member is not None, f"GRPOTrainer.{name} is gone. {SUPPORTED}"
    parameters = tuple(inspect.signature(member).parameters)
    expected = base.TRL_PRIVATE_METHODS[name]
    assert parameters[: len(expected)] == expected, (
        f"GRPOTrainer.{name}{parameters} no longer starts with {expected}. {SUPPORTED}")


def test_private_attributes_of_a_constructed_trainer(plain_trainer):
    for name in base.TRL_PRIVATE_ATTRIBUTES:
        assert hasattr(plain_trainer, name), f"a constructed GRPOTrainer has no `{name}`. {SUPPORTED}"
    assert all(hasattr(plain_trainer._logs["advantages"], m) for m in ("pop", "extend")), SUPPORTED
    assert hasattr(plain_trainer._metrics["train"], "__getitem__"), SUPPORTED
    from trl.generation.vllm_generation import VLLMGeneration

    assert "max_completion_length" in inspect.signature(VLLMGeneration).parameters, SUPPORTED
    source = inspect.getsource(VLLMGeneration)
    for name in base.VLLM_GENERATION_ATTRIBUTES:
        assert f"self.{name} = " in source, f"VLLMGeneration no longer sets `{name}`. {SUPPORTED}"


def test_rollout_tuple_order_and_logged_statistics():
    """`Rollout` names TRL's `_generate` 8-tuple by position; the statistics the base re-logs are TRL's names."""
    source = inspect.getsource(GRPOTrainer._generate)
    names = [f for f in base.Rollout.__dataclass_fields__ if f not in ("rows", "prompts")]
    assert f"return {', '.join(names)}\n" in source, f"GRPOTrainer._generate returns another tuple. {SUPPORTED}"
    for name in (*base.COMPLETION_STATISTICS, "num_tokens", "num_input_tokens_seen"):
        assert f'"{name}"' in source or name in source, f"GRPOTrainer._generate no longer logs {name}. {SUPPORTED}"


def test_log_prob_passes_run_between_generation_and_rewards():
    """`on_final_rollout` work (PPM's early judge requests) overlaps TRL's old/reference log-prob passes only because
    `_generate_and_score_completions` runs them after `_generate` and before `_calculate_rewards`."""
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    generate = source.find("self._generate(")
    old_logps = source.find("old_per_token_logps, _, _ = self._get_per_token_logps_and_entropies(")
    ref_logps = source.find("ref_per_token_logps, _, _ = self._get_per_token_logps_and_entropies(")
    rewards = source.find("self._calculate_rewards(")
    assert -1 not in (generate, old_logps, ref_logps, rewards), f"a step of the rollout is gone. {SUPPORTED}"
    assert generate < old_logps < ref_logps < rewards, (
        f"TRL no longer computes the log-probs between generation and rewards. {SUPPORTED}")


def test_only_the_base_names_trl_private_members(plain_trainer):
    """Every private member of a GRPOTrainer (class or instance) appears in ppm_trl/ only in base.py."""
    private = {name for name in {*dir(GRPOTrainer), *vars(plain_trainer)}
               if name.startswith("_") and not name.startswith("__")} - MODEL_CARD_ATTRIBUTES
    private.add("vllm_generation")  # public name, private internals (max_completion_length, llm, vllm_client)
    pattern = re.compile(r"\b(?:self|trainer|GRPOTrainer|super\(\))\.(" + "|".join(sorted(private)) + r")\b"
                         r"|\bdef (" + "|".join(sorted(private)) + r")\(")
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "base.py" and path.parent.name == "trainers":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = pattern.search(line)
            if match:
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {match.group(0)}")
    assert not offenders, "TRL private members outside ppm_trl/trainers/base.py:\n" + "\n".join(offenders)
    assert pattern.search("self._metrics['train']") and pattern.search("    def _generate(self, prompts):")


def test_unsupported_trl_is_refused_at_import():
    code = "import trl; trl.__version__ = '1.17.0'; import ppm_trl.trainers.base"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "ImportError: ppm_trl's trainers support trl<1.17,>=1.16 but trl 1.17.0 is installed" in result.stderr
