"""One live run per output_dir (issue 41): a second run into a held output_dir is refused naming the holder, a lock
left by a dead run is taken over with a warning, and the lock files never outlive the run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import yaml

from ppm_trl import cli
from ppm_trl.trainers.base import OutputDirInUse, output_dir_lock, run_lock
from ppm_trl.trainers.base.run_lock import HOLDER_FILE, LOCK_FILE

HOLD = textwrap.dedent("""
    import importlib.util, sys
    spec = importlib.util.spec_from_file_location("run_lock", sys.argv[2])  # the module alone: no torch to import
    run_lock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_lock)
    with run_lock.output_dir_lock(sys.argv[1]):
        print("held", flush=True)
        sys.stdin.readline()  # until the test lets go
""")


@pytest.fixture
def held(tmp_path):
    """`tmp_path / "out"` held by another live process; yields (directory, that process's pid)."""
    directory = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(directory), run_lock.__file__], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield directory, holder.pid
    finally:
        holder.communicate("\n", timeout=120)


def test_a_second_run_is_refused_naming_the_live_one(held):
    directory, pid = held
    with pytest.raises(OutputDirInUse, match=rf"is in use by a live run \(pid {pid} on host "
                                             rf"'{socket.gethostname()}', started "):
        with output_dir_lock(str(directory)):
            pass
    assert json.loads((directory / HOLDER_FILE).read_text())["pid"] == pid  # the holder's name is left alone


def test_ppm_trl_train_into_a_held_output_dir_stops_before_the_model_loads(held, tmp_path, capsys):
    directory, pid = held
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"prompt": "1+1?", "answer": "2"}) + "\n")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"method": "grpo", "model_name_or_path": "./no/such/model", "use_cpu": True,
                                      "output_dir": str(directory), "dataset_name": str(data), "max_steps": 1,
                                      "per_device_train_batch_size": 8, "num_generations": 8, "report_to": "none"}))
    with pytest.raises(SystemExit) as exited:
        cli.main(["train", "--config", str(config)])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and f"is in use by a live run (pid {pid}" in err and "Traceback" not in err


def test_a_lock_left_by_a_dead_run_is_taken_over_with_a_warning_and_removed_at_the_end(tmp_path, capsys):
    directory = tmp_path / "out"
    directory.mkdir()
    # What a killed run leaves: its name, and a lock file nobody holds (the OS released it with the process).
    (directory / HOLDER_FILE).write_text(json.dumps({"pid": 999_999_999, "host": "gone", "started": 0}))
    (directory / LOCK_FILE).write_text("")
    with output_dir_lock(str(directory)):
        assert json.loads((directory / HOLDER_FILE).read_text())["pid"] == os.getpid()
        with output_dir_lock(str(directory)):  # re-entrant: the CLI's hold and the trainer's are one
            pass
        assert (directory / HOLDER_FILE).exists()
    err = capsys.readouterr().err
    assert "taking over output_dir" in err and "pid 999999999 on host 'gone'" in err
    assert not (directory / HOLDER_FILE).exists() and not (directory / LOCK_FILE).exists()


def test_only_the_main_process_locks(tmp_path, held):
    directory, _ = held
    with output_dir_lock(str(directory), enabled=False):  # another rank of the same run: no lock, no refusal
        pass
