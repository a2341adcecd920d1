"""`push_to_hub` from every trainer, with the Hub replaced by a local recorder: the card TRL generates names the
method, cites its paper and carries the `ppm-trl` and method tags; the uploaded folder holds the card and weights."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
from dist_train_script import build

# What the card must say, from the papers in shared/papers (not from the trainer classes under test).
PAPERS = {
    "ppm": dict(name="PPM", tag="ppm",
                title="Long-Horizon Language Model Reinforcement Learning via Progressive Point Matching",
                link="https://huggingface.co/papers/2609.07303"),
    "papo": dict(name="PAPO", tag="papo",
                 title="PAPO: Stabilizing Rubric Integration Training via Decoupled Advantage Normalization",
                 link=None),
    "arg": dict(name="ARG", tag="arg",
                title="Balancing Reference Guidance and Free Generation in Trajectory Rollouts for Reasoning RL",
                link=None),
    # the PPM paper's baseline (App. B.1), citing the VeriFree paper it modifies
    "verifree": dict(name="VeriFree", tag="verifree", title="Reinforcing General Reasoning without Verifiers",
                     link=None),
    # the PPM paper's OPSD baseline (App. B.1), citing the PPM paper that defines it
    "opsd": dict(name="OPSD", tag="opsd",
                 title="Long-Horizon Language Model Reinforcement Learning via Progressive Point Matching", link=None),
}
METHODS = list(PAPERS)  # the expected cards, written out by hand; every registered method must have one:


def test_every_registered_method_has_an_expected_card():
    from ppm_trl.registry import METHODS as REGISTERED

    assert {name for name, method in REGISTERED.items() if not method.parts
            and method.trainer.startswith("ppm_trl")} == set(PAPERS)


class RecordingHub:
    """Stands in for `huggingface_hub.HfApi`: records repo creation and uploads, sends nothing."""

    def __init__(self):
        self.created, self.uploads = [], []

    def create_repo(self, repo_id, **kwargs):
        self.created.append(repo_id)
        return SimpleNamespace(repo_id=repo_id if "/" in repo_id else f"someone/{repo_id}")

    def upload_folder(self, repo_id, folder_path, **kwargs):
        self.uploads.append({"repo_id": repo_id, "files": sorted(os.listdir(folder_path)), **kwargs})
        return f"https://huggingface.co/{repo_id}/commit/0"


@pytest.fixture
def hub(monkeypatch):
    import transformers.trainer

    recorder = RecordingHub()
    monkeypatch.setattr(transformers.trainer, "hf_api", lambda: recorder)
    return recorder


@pytest.mark.parametrize("method", METHODS)
def test_push_to_hub_card_names_method_and_cites_paper(method, tmp_path, hub):
    from huggingface_hub import ModelCard

    paper = PAPERS[method]
    output_dir = tmp_path / f"tiny-{method}"
    trainer, _ = build(method, str(output_dir), per_device=4, max_steps=1, max_completion_length=32)
    trainer.push_to_hub(dataset_name="multi_countdown")

    assert hub.created == [f"tiny-{method}"]
    (upload,) = hub.uploads
    assert upload["repo_id"] == f"someone/tiny-{method}"
    assert {"README.md", "model.safetensors", "config.json"} <= set(upload["files"])

    card = ModelCard.load(output_dir / "README.md")
    assert {"ppm-trl", paper["tag"], "trl"} <= set(card.data.tags)
    assert card.data.model_name == f"tiny-{method}"
    text = card.text
    trained_with = text.split("This model was trained with ", 1)[1].split("\n", 1)[0]
    assert paper["name"] in trained_with
    if paper["link"]:
        assert f"[{paper['title']}]({paper['link']})" in trained_with
    citation = text.split("```bibtex", 1)[1].split("```", 1)[0]  # the method's BibTeX comes before TRL's
    assert paper["title"] in citation
    assert "vonwerra2020trl" not in citation


def test_card_keeps_user_tags(tmp_path, hub):
    trainer, _ = build("ppm", str(tmp_path / "tagged"), per_device=4, max_steps=1, max_completion_length=32)
    trainer.push_to_hub(tags=["countdown"])
    from huggingface_hub import ModelCard

    tags = set(ModelCard.load(tmp_path / "tagged" / "README.md").data.tags)
    assert {"countdown", "ppm-trl", "ppm"} <= tags


# ------------------------------------------------------------------ final saves: with `model="tiny"`, no checkpoints
ARXIV = {"ppm": "2609.07303", "papo": "2603.26535", "arg": "2610.11128"}  # from the papers, not the classes


def _tiny_trainer(method, output_dir, peft=False):
    """A trainer built the way the README's quickstart builds one: `model="tiny"`, save_strategy "no"."""
    from datasets import Dataset
    from peft import LoraConfig

    from ppm_trl import ARGConfig, ARGTrainer, PAPOConfig, PAPOTrainer, PPMConfig, PPMGRPOTrainer, make_dataset
    from ppm_trl.rewards import accuracy_reward, env_outcome_reward

    common = dict(output_dir=str(output_dir), use_cpu=True, bf16=False, per_device_train_batch_size=4,
                  num_generations=4, max_completion_length=16, max_steps=1, report_to="none", save_strategy="no")
    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]) if peft else None
    if method == "arg":
        data = Dataset.from_dict({"prompt": [[{"role": "user", "content": "3+4?"}]] * 4, "answer": ["7"] * 4,
                                  "reference": ["3+4=7 \\boxed{7}"] * 4})
        return ARGTrainer(model="tiny", reward_funcs=accuracy_reward, train_dataset=data, peft_config=peft_config,
                          args=ARGConfig(arg_num_continuations=2, arg_max_accepted=2, arg_max_empty_prefix=2,
                                         **common))
    trainer_class, config_class = {"ppm": (PPMGRPOTrainer, PPMConfig), "papo": (PAPOTrainer, PAPOConfig)}[method]
    return trainer_class(model="tiny", reward_funcs=env_outcome_reward, args=config_class(**common),
                         train_dataset=make_dataset("multi_countdown", 1, 4), peft_config=peft_config)


def _assert_method_card(path, method):
    from huggingface_hub import ModelCard

    paper = PAPERS[method]
    card = ModelCard.load(path)
    assert {"ppm-trl", paper["tag"]} <= set(card.data.tags)
    trained_with = card.text.split("This model was trained with ", 1)[1].split("\n", 1)[0]
    assert paper["name"] in trained_with
    assert f"[{paper['title']}](https://huggingface.co/papers/{ARXIV[method]})" in trained_with
    citation = card.text.split("```bibtex", 1)[1].split("```", 1)[0]
    assert paper["title"] in citation and ARXIV[method] in citation
    assert "[None]" not in card.text and "huggingface.co/None" not in card.text
    base = os.path.join(os.path.dirname(os.path.abspath(path)), "initial_tiny_model")
    assert f"fine-tuned version of the local model `{base}`" in card.text
    return card


@pytest.mark.parametrize("method", ["ppm", "papo", "arg"])
def test_final_save_without_checkpoints_writes_the_method_card(method, tmp_path):
    trainer = _tiny_trainer(method, tmp_path / "out")
    trainer.save_model()  # what `ppm-trl train` does after `train()`; save_strategy "no": TRL writes no card
    _assert_method_card(tmp_path / "out" / "README.md", method)


def test_lora_save_has_the_method_card_and_a_loadable_absolute_base(tmp_path, monkeypatch, hub):
    import shutil

    from peft import AutoPeftModelForCausalLM

    trainer = _tiny_trainer("ppm", tmp_path / "out", peft=True)
    trainer.save_model()
    out = tmp_path / "out"
    _assert_method_card(out / "README.md", "ppm")  # not PEFT's boilerplate card
    card = (out / "README.md").read_text()  # issue 44: the card said nothing of LoRA
    assert "- Weights: LoRA, r 4, alpha 8, dropout 0.0, target modules ['q_proj', 'v_proj']" in card
    assert "others cannot load it from there" in card  # a local base model, said plainly
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert os.path.isabs(adapter["base_model_name_or_path"])
    # The adapter alone, copied elsewhere and loaded from another working directory, finds its base model.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copytree(out, elsewhere / "adapter", ignore=shutil.ignore_patterns("initial_tiny_model"))
    monkeypatch.chdir(elsewhere)
    model = AutoPeftModelForCausalLM.from_pretrained("adapter")
    assert any("lora_A" in name for name, _ in model.named_parameters())
    # push_to_hub (Hub replaced at transformers' `hf_api`, see `hub`) uploads this same card.
    saved = (out / "README.md").read_text()
    assert f'model="{out}"' in saved  # the card's usage snippet loads the local save
    trainer.push_to_hub()
    assert "README.md" in hub.uploads[0]["files"]
    pushed = (out / "README.md").read_text()
    assert pushed == saved.replace(f'model="{out}"', 'model="someone/out"')


def test_a_dataset_read_from_a_local_file_is_not_called_by_its_file_format(tmp_path):
    """Issue 44: a Python run's card named its dataset `json` (the builder of `load_dataset("json", ...)`)."""
    from datasets import load_dataset

    from ppm_trl.trainers.base import describe_dataset

    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n")
    assert describe_dataset(load_dataset("json", data_files=str(path), split="train")) is None


def test_a_python_run_writes_its_training_curves_like_the_cli(tmp_path):
    """Issue 44: only `ppm-trl train` drew `training_curves.png`; a Python run's final save draws it too."""
    trainer = _tiny_trainer("ppm", tmp_path / "out")
    trainer.args.logging_steps = 1
    trainer.train()
    trainer.save_model()
    assert (tmp_path / "out" / "training_curves.png").read_bytes()[:4] == b"\x89PNG"
