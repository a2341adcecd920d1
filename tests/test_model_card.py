"""`push_to_hub` from every trainer, with the Hub replaced by a local recorder: the card TRL generates names the
method, cites its paper and carries the `ppm-trl` and method tags; the uploaded folder holds the card and weights."""

from __future__ import annotations

import importlib.util
import os
from types import SimpleNamespace

import pytest
from dist_train_script import build

HAS_ARG = importlib.util.find_spec("ppm_trl.trainers.arg") is not None

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
}
METHODS = [
    "ppm",
    "papo",
    pytest.param("arg", marks=pytest.mark.skipif(not HAS_ARG, reason="ppm_trl.trainers.arg not written yet")),
]


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
