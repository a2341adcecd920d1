"""The README's Python quickstart runs as written (read from README.md, so the two cannot drift)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_block(section: str, language: str, index: int = 0) -> str:
    """The `index`-th ```language block under the `## section` heading of README.md."""
    text = README.read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(rf"```{language}\n(.*?)```", body, re.DOTALL)
    assert len(blocks) > index, f"README section {section!r} has no {language} block {index}"
    return blocks[index]


def test_python_quickstart_runs_verbatim(tmp_path, monkeypatch):
    import ppm_trl

    snippet = readme_block("Quickstart (Python)", "python")
    real_config = ppm_trl.PPMConfig

    written = {}

    def short_config(**kwargs):  # the only change: 2 steps of 32 tokens instead of a full run
        written.update(kwargs)
        return real_config(**{**kwargs, "max_steps": 2, "max_completion_length": 32, "report_to": "none"})

    monkeypatch.setattr(ppm_trl, "PPMConfig", short_config)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(snippet, str(README), "exec"), namespace)
    trainer = namespace["trainer"]
    # As written, the run is bounded: without max_steps it is 3 epochs of the 512 prompts (1,536 steps)
    assert 0 < written.get("max_steps", -1) <= 100, written
    assert trainer.state.global_step == 2
    assert trainer.args.bf16 is False  # on this CPU machine
    card = (tmp_path / "out" / "README.md").read_text()
    assert "PPM" in card and "2609.07303" in card and "initial_tiny_model" in card


def test_cli_picks_bf16_unless_set(tmp_path):
    import torch

    from ppm_trl import cli

    base = ["--method", "ppm", "--output_dir", str(tmp_path), "--use_cpu", "true", "--num_generations", "8",
            "--per_device_train_batch_size", "8"]
    _, training_args, _ = cli.parse_train_args(base)
    expected = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    assert training_args.bf16 is expected  # TRL's own default would be True, which fails on a CPU
    config = tmp_path / "c.yaml"
    config.write_text("bf16: false\n")
    _, training_args, _ = cli.parse_train_args([*base, "--config", str(config)])
    assert training_args.bf16 is False
