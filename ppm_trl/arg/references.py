"""References that can guide (ARG App. E.1): a non-empty solution ending in the boxed final answer; a dataset's
`reference` column checked (or its invalid rows skipped, counted) when the trainer is built.
"""

from __future__ import annotations

import logging

from ..text import last_boxed

logger = logging.getLogger(__name__)


def reference_problem(reference, answer_marker: str = "\\boxed") -> str | None:
    """Why `reference` cannot guide (None when it can): it must be a non-empty string ending in a final answer."""
    if not isinstance(reference, str) or not reference.strip():
        return f"expected a non-empty reference solution string, got {reference!r:.80}"
    if answer_marker not in reference:
        return f"the reference has no final answer marker {answer_marker!r} (App. E.1 drops such references)"
    if answer_marker == "\\boxed":
        boxed = last_boxed(reference)
        if boxed is None or not boxed.strip():
            return "the reference's last \\boxed{...} is unclosed or empty; it must end in the boxed final answer"
    return None


def check_references(dataset, answer_marker: str, skip_invalid: bool):
    """The dataset, validated for ARG; with `skip_invalid` the invalid rows are dropped (returns dataset, count).

    A missing `reference` column, or (without `skip_invalid`) a bad row, is a ValueError naming the row. Iterable
    datasets are checked row by row during training instead.
    """
    if dataset is None:
        raise ValueError("ARGTrainer needs a train_dataset with a `reference` column")
    if isinstance(dataset, dict):
        raise ValueError("ARGTrainer trains on one dataset; pass a single split as train_dataset, not a dict")
    columns = getattr(dataset, "column_names", None) or []
    if "reference" not in columns:
        raise ValueError(
            f"ARG needs a `reference` column (a reference solution ending in {answer_marker}{{answer}}) in the "
            f"dataset; found columns {sorted(columns)}"
        )
    if not hasattr(dataset, "__len__"):
        return dataset, 0
    bad = []
    for row, reference in enumerate(dataset["reference"]):
        problem = reference_problem(reference, answer_marker)
        if problem is not None:
            if not skip_invalid:
                raise ValueError(
                    f"ARG: column `reference`, row {row}: {problem}. Fix the row or set "
                    "arg_skip_invalid_references=True to skip such rows (counted)."
                )
            bad.append(row)
    if not bad:
        return dataset, 0
    if len(bad) == len(dataset):
        raise ValueError(f"ARG: all {len(bad)} rows have an invalid `reference`; nothing left to train on")
    logger.warning(
        "ARG: skipping %d of %d rows with an invalid `reference` (first rows: %s)", len(bad), len(dataset), bad[:10]
    )
    keep = sorted(set(range(len(dataset))) - set(bad))
    return dataset.select(keep), len(bad)
