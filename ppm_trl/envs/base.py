"""The interface every synthetic task implements.

A task generates rows with the dataset columns of `docs/design.md`, section "Data" (`prompt`, `answer`,
`reference`, `reasoning_points`, `reasoning_graph`), and knows, without an LLM, which reasoning points a text
prefix has reached (`match_points`) and whether a full completion is correct (`verify`).
Point numbers are 1-based, as in the paper.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class SyntheticEnv(ABC):
    """Deterministic generator + programmatic matcher + outcome verifier for one task family."""

    name: str = ""

    @abstractmethod
    def generate_row(self, n: int, rng) -> dict[str, Any]:
        """One problem of horizon `n` from a `random.Random`, with every column of `docs/design.md`, "Data"."""

    @abstractmethod
    def match_points(self, row: dict[str, Any], text: str) -> set[int]:
        """1-based reasoning points that `text` (a completion prefix) has reached, before graph closure."""

    @abstractmethod
    def verify(self, row: dict[str, Any], text: str) -> bool:
        """Whether the full completion `text` solves the problem (the outcome reward)."""
