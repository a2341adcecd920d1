"""Hub uploads without the run's private files.

`push_to_hub`, and the pushes during training with `push_to_hub=True`, leave out the files a run keeps for itself in
`output_dir` (`run_private_patterns`: the judge cache with its answers and `api_base`, `quarantine.jsonl` with
dataset text, the untrained tiny model, prepare's progress and failures files, any symlink): Trainer uploads `output_dir` with a fixed `ignore_patterns` and no argument
to extend it, so during a push the `hf_api()` it calls (`HUB_API`) gives an `upload_folder` that adds them.
"""

from __future__ import annotations

import glob
import os
from contextlib import contextmanager
from pathlib import Path

from ...judge.quarantine import QUARANTINE_FILE
from ...judge.settings import judge_cache_dir
from .run_lock import HOLDER_FILE, LOCK_FILE

# Where Trainer's pushes get their HfApi: (module, function). Replaced only for the duration of a push
# (`uploads_ignoring`); tests/trainers/test_hub_upload.py checks the files an upload takes end to end.
HUB_API = ("transformers.trainer", "hf_api")
# Files a run (or `ppm-trl prepare`, whose work dir may sit inside output_dir) writes for itself, as huggingface_hub
# `ignore_patterns` (a trailing "/" covers a folder's files): never part of a Hub upload, at any depth of output_dir.
# The judge cache's configured place and every symlink are added per push (`run_private_patterns`).
RUN_PRIVATE_FILES = (
    "judge_cache/",  # the default judge_cache_dir: every judge answer, and the api_base it came from
    QUARANTINE_FILE,  # dataset text of the rows the judge could not score
    "initial_tiny_model*/",  # `model="tiny"`: the untrained starting weights, not the trained model
    "prepare_progress.jsonl", "prepare_failures.jsonl",  # prepare's judged rows and the rows it left out (data.py)
    LOCK_FILE, HOLDER_FILE,  # the live run's lock and its pid and host (`run_lock`)
)
# The judge cache's own layout (ppm_trl/judge/cache.py, claims.py), for a judge_cache_dir that is output_dir itself.
_JUDGE_CACHE_LAYOUT = ("[0-9a-f][0-9a-f]/", "claims/")


def run_private_patterns(args) -> list[str]:
    """`RUN_PRIVATE_FILES` at any depth, a `judge_cache_dir` inside `args.output_dir` (compared as real paths, its
    name escaped: `cache[v2]` is a name, not a character class), and every symlink under output_dir (an upload would
    send its target's content, which may live anywhere)."""
    patterns = [pattern for name in RUN_PRIVATE_FILES for pattern in (name, f"*/{name}")]
    output_dir = os.path.realpath(args.output_dir)
    cache = judge_cache_dir(getattr(args, "judge_cache_dir", None), None)  # unset: judge_cache/, listed above
    if cache:
        relative = os.path.relpath(os.path.realpath(cache), output_dir)
        if relative == ".":
            patterns.extend(_JUDGE_CACHE_LAYOUT)
        elif not relative.startswith(os.pardir):  # outside output_dir it is never uploaded
            patterns.append(glob.escape(Path(relative).as_posix()) + "/")
    return patterns + symlink_patterns(output_dir)


def symlink_patterns(folder: str) -> list[str]:
    """An ignore pattern for each symlink under `folder` (itself and, for a folder, what is under it)."""
    patterns = []
    for root, directories, files in os.walk(folder):  # does not descend into symlinked folders
        for name in directories + files:
            path = os.path.join(root, name)
            if os.path.islink(path):
                relative = glob.escape(Path(os.path.relpath(path, folder)).as_posix())
                patterns.extend([relative, relative + "/"])
    return patterns


@contextmanager
def uploads_ignoring(patterns: list[str]):
    """While in the block, the Hub uploads Trainer makes also skip `patterns` (huggingface_hub's `ignore_patterns`
    of `upload_folder`). Trainer passes a fixed list and offers no way to extend it; its `hf_api()` is swapped for
    the block only, and every other call goes to the shared HfApi unchanged."""
    import importlib

    module = importlib.import_module(HUB_API[0])
    shared = getattr(module, HUB_API[1])

    class Uploader:
        def __getattr__(self, name):
            return getattr(shared(), name)

        def upload_folder(self, **kwargs):
            ignored = kwargs.get("ignore_patterns") or []
            ignored = [ignored] if isinstance(ignored, str) else list(ignored)
            return shared().upload_folder(**{**kwargs, "ignore_patterns": [*ignored, *patterns]})

    uploader = Uploader()
    setattr(module, HUB_API[1], lambda: uploader)
    try:
        yield
    finally:
        setattr(module, HUB_API[1], shared)


class HubUnreachable(ValueError):
    """`push_to_hub=True` and the Hub cannot be reached or refuses the repo (offline, no token, no permission): one
    line naming what to do, at construction, before any training (`ppm-trl train` prints it, exit 2)."""


def _hub_error(error: BaseException) -> bool:
    module = type(error).__module__
    return isinstance(error, OSError) or module.startswith(("huggingface_hub", "httpx", "requests", "urllib3"))


class HubUploads:
    """The trainer's pushes, each leaving the run's private files out (mixed into `MethodTrainer`)."""

    def init_hf_repo(self, *args, **kwargs):
        """Trainer's repo creation for `push_to_hub=True`, with a failure to reach the Hub said in one line."""
        try:
            return super().init_hf_repo(*args, **kwargs)
        except Exception as error:
            if not _hub_error(error):
                raise
            first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300].rstrip(".")
            repo = self.args.hub_model_id or "named after output_dir"
            raise HubUnreachable(
                f"push_to_hub: the Hub cannot create or reach the repo ({repo}): {type(error).__name__}: {first}. "
                "Check the network (HF_HUB_OFFLINE), log in "
                "(`hf auth login` or HF_TOKEN) with write access, or set hub_model_id to a repo you may write; or "
                "train without --push_to_hub and push later") from error

    def push_to_hub(self, *args, **kwargs):
        """Trainer's `push_to_hub`, leaving the run's private files out of the upload (`run_private_patterns`)."""
        with uploads_ignoring(run_private_patterns(self.args)):
            return super().push_to_hub(*args, **kwargs)

    def _push_from_checkpoint(self, checkpoint_folder):
        with uploads_ignoring(run_private_patterns(self.args)):  # it uploads output_dir too
            return super()._push_from_checkpoint(checkpoint_folder)
