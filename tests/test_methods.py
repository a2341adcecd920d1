"""The method registry: the one table the CLI, the examples, the demo and `ppm_trl`'s exports read."""

from __future__ import annotations

import re

import pytest
from trl import GRPOConfig, GRPOTrainer

import ppm_trl
from ppm_trl.methods import METHODS, Method, get_method, register_method


def test_every_method_names_importable_trl_classes():
    assert {"grpo", "ppm", "papo", "arg", "ppm+arg", "papo+arg"} <= set(METHODS)
    for method in METHODS.values():
        assert issubclass(method.config_class(), GRPOConfig), method.name
        assert issubclass(method.trainer_class(), GRPOTrainer), method.name


def test_ppm_trl_exports_every_registered_trainer_and_config():
    for method in METHODS.values():
        if method.name == "grpo":
            continue
        for path in (method.trainer, method.config):
            name = path.split(":")[1]
            assert name in ppm_trl.__all__
            assert getattr(ppm_trl, name) is getattr(method, "trainer_class" if path == method.trainer else
                                                     "config_class")()


def test_unknown_and_duplicate_methods_are_errors():
    with pytest.raises(ValueError, match=re.escape("unknown method 'ppo'; accepted: grpo, ppm, papo, arg, ppm+arg, papo+arg")):
        get_method("ppo")
    with pytest.raises(ValueError, match="already registered"):
        register_method(Method("ppm", "ppm_trl.configs:PPMConfig", "ppm_trl.trainers.ppm:PPMGRPOTrainer"))
    assert get_method("arg").extra_rewards == ("format",)
