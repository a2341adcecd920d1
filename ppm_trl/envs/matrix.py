"""Matrix manipulation (paper §5.1, App. C; adapted from Reasoning Gym's manipulate_matrix).

n operations (rotations, transposes, flips, element-wise add/multiply, row/column removal) applied in order to
a small integer matrix. Line format (one line per operation, then the final answer):

    M1: [[1,6],[5,0],[9,1]]
    M2: [[4,9],[8,3],[12,4]]
    \\boxed{[[4,9],[8,3],[12,4]]}

Point k = the FIRST well-formed `Mk: [[...],[...]]` line (ended by a newline) equals the matrix after
operation k; the last point is also reached by a correct final `\\boxed{}` (the outcome). Each operation
needs the previous result, so the graph is a chain: point k makes 1..k-1 obsolete. Operations that would
leave the matrix unchanged are redrawn, so every point is a new matrix.
"""

from __future__ import annotations

import re
from typing import Any

from ppm_trl.envs import build_row, first_statements, load_task
from ppm_trl.envs.base import SyntheticEnv
from ppm_trl.text import last_boxed

Matrix = list[list[int]]

MAX_VALUE = 99  # element-wise ops are redrawn when they would exceed it (short numbers)
_LINE = re.compile(r"^\s*M(\d{1,4})\s*:\s*(.*?)\s*$", re.ASCII)
_MATRIX = re.compile(r"\[\[-?\d{1,12}(?:,-?\d{1,12})*\](?:,\[-?\d{1,12}(?:,-?\d{1,12})*\])*\]", re.ASCII)
_ROW = re.compile(r"\[([-\d,]+)\]", re.ASCII)


def format_matrix(matrix: Matrix) -> str:
    return "[" + ",".join("[" + ",".join(str(v) for v in row) + "]" for row in matrix) + "]"


def parse_matrix(text: str | None) -> Matrix | None:
    """`[[1,2],[3,4]]` (spaces allowed) → rows; None unless the whole text is that format (rows may be ragged)."""
    if text is None:
        return None
    compact = re.sub(r"\s+", "", text)
    if len(compact) > 2000 or not _MATRIX.fullmatch(compact):
        return None
    return [[int(v) for v in row.split(",")] for row in _ROW.findall(compact)]


def _transpose(m: Matrix) -> Matrix:
    return [list(r) for r in zip(*m)]


def _operations(m: Matrix, rng) -> list[tuple[str, Matrix]]:
    """Every (description, result) candidate for one step; parameters are drawn from `rng`."""
    rows, cols = len(m), len(m[0])
    add, factor = rng.randint(1, 5), rng.randint(2, 3)
    ops = [
        ("rotate 90 degrees clockwise", _transpose(m[::-1])),
        ("rotate 180 degrees", [r[::-1] for r in m[::-1]]),
        ("rotate 90 degrees counterclockwise", _transpose(m)[::-1]),
        ("transpose (row i becomes column i)", _transpose(m)),
        ("mirror along the anti-diagonal (transpose, then rotate 180 degrees)",
         [r[::-1] for r in _transpose(m)[::-1]]),
        ("reverse the order of the columns (left-right mirror)", [r[::-1] for r in m]),
        ("reverse the order of the rows (upside-down mirror)", m[::-1]),
        (f"add {add} to every entry", [[v + add for v in r] for r in m]),
        (f"multiply every entry by {factor}", [[v * factor for v in r] for r in m]),
    ]
    if rows > 2:
        row = rng.randint(1, rows)
        ops.append((f"delete row {row} (counting from 1 at the top)", m[: row - 1] + m[row:]))
    if cols > 2:
        col = rng.randint(1, cols)
        ops.append((f"delete column {col} (counting from 1 at the left)", [r[: col - 1] + r[col:] for r in m]))
    return [(desc, result) for desc, result in ops
            if result != m and max(v for r in result for v in r) <= MAX_VALUE]


class MatrixEnv(SyntheticEnv):
    name = "matrix"

    def generate_row(self, n: int, rng) -> dict[str, Any]:
        matrices, descriptions = self._walk(n, rng)
        start = matrices[0]
        final = format_matrix(matrices[-1])
        user_text = (
            f"Apply the {n} operation{'s' if n > 1 else ''} to the matrix in order. After operation k write one "
            "line `Mk: <matrix>` in the same [[row],[row]] format, then the final matrix as \\boxed{<matrix>}.\n"
            f"Matrix: {format_matrix(start)}\n"
            + "\n".join(f"{k}. {d}" for k, d in enumerate(descriptions, start=1))
        )
        lines = [f"M{k}: {format_matrix(m)}" for k, m in enumerate(matrices[1:], start=1)]
        reference = "\n".join(lines + [f"\\boxed{{{final}}}"])
        points = [f"After operation {k} ({d}): {format_matrix(m)}"
                  for k, (d, m) in enumerate(zip(descriptions, matrices[1:]), start=1)]
        points[-1] += f"; final answer \\boxed{{{final}}}"
        graph = [{"if_all": [k], "makes_obsolete": list(range(1, k))} for k in range(2, n + 1)]
        return build_row(self.name, n, user_text, final, reference, points, graph, {"matrices": matrices[1:]})

    @staticmethod
    def _walk(n: int, rng) -> tuple[list[Matrix], list[str]]:
        """Start matrix and n operations; restarts in the rare dead end (constant matrix at the value cap)."""
        while True:
            rows, cols = rng.randint(2, 3), rng.randint(2, 3)
            matrices = [[[rng.randint(0, 9) for _ in range(cols)] for _ in range(rows)]]
            descriptions = []
            while len(descriptions) < n:
                candidates = _operations(matrices[-1], rng)
                if not candidates:
                    break
                description, result = rng.choice(candidates)
                descriptions.append(description)
                matrices.append(result)
            else:
                return matrices, descriptions

    def match_points(self, row: dict[str, Any], text: str) -> set[int]:
        expected = load_task(row)["matrices"]

        def parse_line(line: str):
            match = _LINE.match(line)
            if match is None:
                return None
            matrix = parse_matrix(match.group(2))
            return None if matrix is None else (int(match.group(1)), matrix)

        reached = {k for k, matrix in first_statements(text, parse_line).items()
                   if 1 <= k <= len(expected) and matrix == expected[k - 1]}
        if self.verify(row, text):
            reached.add(len(expected))
        return reached

    def verify(self, row: dict[str, Any], text: str) -> bool:
        return parse_matrix(last_boxed(text)) == load_task(row)["matrices"][-1]
