"""The dataset card `ppm-trl prepare --push-to-hub` uploads beside the prepared rows."""

from __future__ import annotations

import argparse
import hashlib


def dataset_card(args: argparse.Namespace, kept: int, total: int, reasons: str) -> str:
    """The README a pushed dataset gets: where it came from, how it was judged, what was left out and why."""
    from importlib import resources

    prompts = sorted(p for p in resources.files("ppm_trl.judge").joinpath("prompts").iterdir() if p.name.endswith(".txt"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in prompts)).hexdigest()[:12]
    return "\n".join([
        "---", "tags:", "- ppm-trl", "- reasoning-points", "---", "",
        f"# {args.push_to_hub}", "",
        f"Reasoning points and obsoletion graphs for `{args.dataset}` (split `{args.split}`"
        + (f", config `{args.config_name}`" if args.config_name else "") + "), written by `ppm-trl prepare` for PPM's "
        "progress rewards (arXiv:2609.07303).", "",
        f"- Source: `{args.dataset}`; problem column `{args.problem_column}`, reference column "
        f"`{args.reference_column}`, answer column `{args.answer_column or '(from the reference)'}`",
        (f"- Judge model: `{args.judge_model}`; judge prompts sha256 `{digest}` (ppm_trl/judge/prompts/)"
         if getattr(args, "points_column", None) is None else f"- Points from the source's column `{args.points_column}`, graphs from "
         f"`{args.graph_column or '(none)'}`; no judge call"),
        f"- Rows: {kept} of {total} kept; left out {total - kept} ({reasons})",
        "- Columns written: `prompt`, `answer`, `reference`, `reasoning_points`, `reasoning_graph` (an input column of "
        "those names is kept as `original_<name>`)", ""])
