"""What a run keeps for itself in `output_dir` never goes to the Hub (issue 34 item 3): the judge cache (answers and
the `api_base` they came from), `quarantine.jsonl` (dataset text) and the untrained tiny model stay out of
`push_to_hub` and of the pushes made while training with `push_to_hub=True`.

The Hub is a recorder (nothing is sent): each upload's file list is what `HfApi.upload_folder` would take — every
file under `folder_path`, filtered by huggingface_hub's own `filter_repo_objects` with the upload's
`allow_patterns`, its `ignore_patterns` and huggingface_hub's `DEFAULT_IGNORE_PATTERNS`. At the end, the same
push through huggingface_hub's real client to a Hub on 127.0.0.1 (`tests/fake_hub.py`, issue 44 item 3): the files
that arrive, the card and the weights as the Hub receives them, and a refused token as one line."""

from __future__ import annotations

import os
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import build_trainer, script_generation
from huggingface_hub.hf_api import DEFAULT_IGNORE_PATTERNS
from huggingface_hub.utils import filter_repo_objects

from ppm_trl.envs import make_dataset
from ppm_trl.trainers.base import run_private_patterns

KEY = "ab" + "0" * 62  # a judge cache key (sha256 hex)


class RecordingHub:
    """Stands in for the HfApi Trainer uploads through: records the files each `upload_folder` would send."""

    def __init__(self):
        self.uploads: list[dict] = []

    def create_repo(self, repo_id, **kwargs):
        return SimpleNamespace(repo_id=f"someone/{repo_id}")

    def upload_folder(self, *, repo_id, folder_path, path_in_repo=None, allow_patterns=None, ignore_patterns=None,
                      run_as_future=False, **kwargs):
        if isinstance(ignore_patterns, str):
            ignore_patterns = [ignore_patterns]
        folder = Path(folder_path).expanduser().resolve()
        files = sorted(path.relative_to(folder).as_posix() for path in folder.glob("**/*") if path.is_file())
        taken = filter_repo_objects(files, allow_patterns=allow_patterns,
                                    ignore_patterns=[*(ignore_patterns or []), *DEFAULT_IGNORE_PATTERNS])
        self.uploads.append({"folder": str(folder), "path_in_repo": path_in_repo, "files": sorted(taken)})
        if run_as_future:
            future = Future()
            future.set_result(f"https://huggingface.co/{repo_id}/commit/0")
            return future
        return f"https://huggingface.co/{repo_id}/commit/0"


@pytest.fixture
def hub(monkeypatch):
    import transformers.trainer

    recorder = RecordingHub()
    monkeypatch.setattr(transformers.trainer, "hf_api", lambda: recorder)
    return recorder


def _trainer(output_dir: Path, **overrides):
    settings = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=8, num_segments=2,
                    max_steps=1)
    trainer = build_trainer("ppm", output_dir, train_dataset=make_dataset("multi_add", 2, 4, seed=0),
                            **{**settings, **overrides})
    script_generation(trainer, lambda prompt, index: "1")
    return trainer


def _plant_private_files(output_dir: Path, cache_dir: Path) -> set[str]:
    """The files a run writes for itself (a cached judge answer and a claim lock, the quarantine list, the tiny
    model's start), as paths relative to output_dir."""
    planted = {cache_dir / KEY[:2] / f"{KEY}.json": '{"answer": "YES", "api_base": "http://judge.internal:8000/v1"}',
               cache_dir / "claims" / KEY[:2] / f"{KEY}.lock": "",
               output_dir / "quarantine.jsonl": '{"key": "1f", "problem": "a private dataset row"}\n',
               output_dir / "initial_tiny_model" / "config.json": "{}"}
    for path, text in planted.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return {path.relative_to(output_dir).as_posix() for path in planted}


def _files_under(folder: Path) -> set[str]:
    return {path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file()}


@pytest.mark.parametrize("cache", ["default", "inside", "output_dir"])
def test_push_to_hub_uploads_every_file_but_the_runs_private_ones(tmp_path, hub, cache):
    output_dir = tmp_path / "out"
    cache_dir = {"default": output_dir / "judge_cache", "inside": output_dir / "state" / "answers",
                 "output_dir": output_dir}[cache]
    trainer = _trainer(output_dir, judge_cache_dir=None if cache == "default" else str(cache_dir))
    trainer.save_model()
    private = _plant_private_files(output_dir, cache_dir)
    trainer.push_to_hub()

    (upload,) = hub.uploads
    assert upload["folder"] == str(output_dir.resolve())
    assert {"README.md", "config.json", "model.safetensors", "training_args.bin"} <= set(upload["files"])
    assert set(upload["files"]) == _files_under(output_dir) - private  # the exact list: all else goes
    import transformers.trainer

    assert transformers.trainer.hf_api() is hub  # Trainer's own hf_api is back after the push


def test_pushes_while_training_leave_the_runs_private_files_out(tmp_path, hub):
    output_dir = tmp_path / "out"
    trainer = _trainer(output_dir, push_to_hub=True, hub_strategy="checkpoint", save_strategy="steps", save_steps=1)
    private = _plant_private_files(output_dir, output_dir / "judge_cache")
    trainer.train()  # step 1's checkpoint is pushed: output_dir's model files, and the checkpoint folder

    folder_upload, checkpoint_upload = hub.uploads
    assert folder_upload["folder"] == str(output_dir.resolve()) and folder_upload["files"]
    assert not set(folder_upload["files"]) & private
    assert set(folder_upload["files"]) == _files_under(output_dir) - private - {
        name for name in _files_under(output_dir) if name.startswith("checkpoint-")}
    assert checkpoint_upload["path_in_repo"] == "last-checkpoint"
    # the checkpoint folder holds no run-private file; it goes as TRL sends it (listed here before our completion
    # marker, written after Trainer's save and push)
    assert {"trainer_state.json", "model.safetensors"} <= set(checkpoint_upload["files"]) <= _files_under(
        output_dir / "checkpoint-1")


def test_run_private_patterns_follow_the_configured_cache():
    def patterns(cache):
        return run_private_patterns(SimpleNamespace(output_dir="/runs/out", judge_cache_dir=cache))

    assert patterns(None)[:4] == ["judge_cache/", "*/judge_cache/", "quarantine.jsonl", "*/quarantine.jsonl"]
    from ppm_trl.data import FAILURES_FILE, PROGRESS_FILE

    assert {PROGRESS_FILE, f"*/{FAILURES_FILE}"} <= set(patterns(None))  # prepare's own file names
    assert patterns("none") == patterns(None) == patterns("/elsewhere/cache") == patterns("/runs/out2/cache")
    assert patterns("/runs/out/a/b")[-1] == "a/b/"
    assert patterns("/runs/out/cache[v2]")[-1] == "cache[[]v2]/"  # a name, not a character class
    assert patterns(os.path.join("/runs/out", "."))[-2:] == ["[0-9a-f][0-9a-f]/", "claims/"]
    assert run_private_patterns(SimpleNamespace(output_dir="/runs/out")) == patterns(None)  # ARG: no judge args


def test_the_upload_filter_compares_real_paths_escapes_names_and_skips_nested_private_files_and_symlinks(tmp_path, hub):
    """Issue 41: a cache named with glob characters, an output_dir reached through a symlink, a prepare output nested
    in output_dir and a symlinked file each reached the Hub."""
    real = tmp_path / "real_out"
    real.mkdir()
    output_dir = tmp_path / "out_link"
    output_dir.symlink_to(real)  # the run is given the symlink, the cache its real path
    trainer = _trainer(output_dir, judge_cache_dir=str(real / "cache[v2]"))
    trainer.save_model()
    private = _plant_private_files(real, real / "cache[v2]")
    nested = {real / "data" / "judge_cache" / KEY[:2] / f"{KEY}.json": '{"answer": "NO"}',
              real / "data" / "prepare_failures.jsonl": '{"index": 3, "problem": "a private row"}\n',
              real / "data" / "prepare_progress.jsonl": '{"meta": {}}\n'}
    for path, text in nested.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    secret = tmp_path / "elsewhere" / "id_rsa"
    secret.parent.mkdir()
    secret.write_text("-----BEGIN PRIVATE KEY-----")
    (real / "notes.txt").symlink_to(secret)
    (real / "linked_dir").symlink_to(secret.parent, target_is_directory=True)
    trainer.push_to_hub()

    (upload,) = hub.uploads
    uploaded = set(upload["files"])
    assert {"README.md", "config.json", "model.safetensors"} <= uploaded
    assert not uploaded & private, uploaded & private
    assert not {p.relative_to(real).as_posix() for p in nested} & uploaded
    assert not {name for name in uploaded if name.startswith(("notes.txt", "linked_dir"))}


@pytest.mark.parametrize("failure", ["offline", "refused"])
def test_a_hub_that_cannot_be_reached_is_one_line_at_construction(tmp_path, monkeypatch, failure):
    """Issue 44: `--push_to_hub true` without network was a 51-line traceback at construction."""
    import transformers.trainer
    from huggingface_hub.errors import OfflineModeIsEnabled

    from ppm_trl.trainers.base.hub import HubUnreachable

    class Unreachable:
        def create_repo(self, repo_id, **kwargs):
            if failure == "offline":
                raise OfflineModeIsEnabled("Cannot reach https://huggingface.co/api/repos/create: offline mode is enabled.")
            raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(transformers.trainer, "hf_api", lambda: Unreachable())
    with pytest.raises(HubUnreachable) as error:
        _trainer(tmp_path / "out", push_to_hub=True)
    message = str(error.value)
    assert message.startswith("push_to_hub: the Hub cannot create or reach the repo") and "\n" not in message
    assert "HF_TOKEN" in message and ("OfflineModeIsEnabled" in message or "PermissionError" in message)


# -------------------------------------------------------------------------- the real client, a loopback Hub
@pytest.fixture
def loopback_hub(monkeypatch):
    """huggingface_hub's own HfApi (through transformers' shared `hf_api()`), online, at a `FakeHub` on 127.0.0.1."""
    import huggingface_hub.constants as hub_constants
    import transformers.utils.hub as transformers_hub
    from fake_hub import FakeHub

    def start(refuse: int | None = None):
        hub = FakeHub(refuse=refuse).__enter__()
        started.append(hub)
        monkeypatch.setattr(hub_constants, "ENDPOINT", hub.endpoint)
        monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(transformers_hub, "_hf_api", None)  # its next HfApi reads the endpoint above
        monkeypatch.setenv("HF_TOKEN", "hf_fake_token_for_the_loopback_hub")
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        return hub

    started = []
    yield start
    for hub in started:
        hub.__exit__(None, None, None)
    transformers_hub._hf_api = None


def test_push_to_hub_uploads_the_model_card_and_weights_to_a_hub_and_nothing_private(tmp_path, loopback_hub):
    hub = loopback_hub()
    out = tmp_path / "tiny-ppm"
    trainer = _trainer(out)
    script_generation(trainer, lambda prompt, index: "a:1+1=2\n\\boxed{a=2}")
    trainer.train()
    (out / "judge_cache" / "ab").mkdir(parents=True)
    (out / "judge_cache" / "ab" / f"{KEY}.json").write_text('{"api_base": "http://10.0.0.1:8000/v1"}')
    trainer.push_to_hub(dataset_name="multi_add")

    assert hub.created == ["someone/tiny-ppm"]
    files = hub.repos["someone/tiny-ppm"]
    assert {"README.md", "model.safetensors", "config.json", "tokenizer.json", "training_args.bin"} <= set(files)
    assert not [name for name in files if name.startswith(("judge_cache", "initial_tiny_model"))], sorted(files)
    card = files["README.md"].decode()
    assert "This model was trained with PPM-GRPO" in card and "ppm-trl" in card
    assert card == (out / "README.md").read_text()  # the card on the Hub is the one saved beside the model
    from safetensors.torch import load

    weights = load(files["model.safetensors"])
    trained = trainer.model.state_dict()
    assert weights.keys() <= trained.keys() and all(
        (weights[name] == trained[name].to(weights[name].dtype)).all() for name in weights)
    assert hub.commits[-1]["header"]["summary"]  # a commit message, as Trainer writes it


@pytest.mark.parametrize("status", [401, 403])
def test_a_hub_that_refuses_the_token_is_one_line_at_construction(tmp_path, loopback_hub, status):
    from ppm_trl.trainers.base.hub import HubUnreachable

    hub = loopback_hub(refuse=status)
    with pytest.raises(HubUnreachable) as error:
        _trainer(tmp_path / "out", push_to_hub=True)
    message = str(error.value)
    assert message.startswith("push_to_hub: the Hub cannot create or reach the repo") and "\n" not in message
    assert "HF_TOKEN" in message and str(status) in message
    assert hub.requests and hub.requests[0].startswith("POST /api/repos/create")
