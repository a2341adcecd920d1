"""Parsers for judge answers. Each returns None for an answer it cannot read with certainty — never a guess.

A None makes the item unscorable (NaN reward, zero advantage, counted), which is better than a silent 0 or a
grade read from the wrong place: the PPM answer quotes the rollout verbatim in Section 1, so a rollout that
contains its own "Section 2 – Grades / 1. YES" list would otherwise be read as the verdict.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from fractions import Fraction

_SECTION_HEADER = re.compile(r"^[ \t#*_]*section\s*([12])\b[^\n]*$", re.IGNORECASE | re.MULTILINE)
_GRADE_LINE = re.compile(r"^[ \t*_]*(\d+)\s*[.):]?\s*[*_]*\s*(yes|no)\s*[*_]*\s*\.?\s*[*_]*$", re.IGNORECASE)
_VERDICT = re.compile(r"verdict\s*[*_]*\s*:", re.IGNORECASE)
_FENCE = re.compile(r"^\s*(```\w*|~~~)\s*$")
_BOXED = re.compile(r"\\boxed\s*\{")
_RUBRIC_BLOCK = re.compile(r"<\s*rubric\s*>(.*?)<\s*/\s*rubric\s*>", re.IGNORECASE | re.DOTALL)
_NUMBERED_ITEM = re.compile(r"^\s*(\d+)\s*[.)]\s*(.*)$")
_GRAPH_BLOCK = re.compile(r"<\s*makes_obsolete_graph\s*>(.*?)<\s*/\s*makes_obsolete_graph\s*>", re.DOTALL)
_CONCLUSION = re.compile(r"<\s*conclusion\s*>\s*(correct|incorrect)\s*\.?\s*<\s*/\s*conclusion\s*>", re.IGNORECASE)


def _grade_lines(lines: Sequence[str], num_points: int) -> list[bool] | None:
    """A numbered YES/NO list 1..num_points (blank lines and code fences allowed in between), or None."""
    grades: list[bool] = []
    for line in lines:
        if not line.strip() or _FENCE.match(line):
            continue
        match = _GRADE_LINE.match(line)
        if match is None or int(match.group(1)) != len(grades) + 1:
            return None
        grades.append(match.group(2).lower() == "yes")
    return grades if len(grades) == num_points else None


def parse_point_grades(text: str, num_points: int) -> list[bool] | None:
    """PPM grading answer (App. D) → one bool per rubric point, read ONLY from the final 'Section 2' list.

    Requires a 'Section 1' header before the last 'Section 2' header with at least `num_points` verdicts between
    them (a completed Section 1), and after it exactly the lines `1. YES|NO` … `num_points. YES|NO` and nothing
    else. Only the bare word YES grades a point as reached ('YES, partially' is unreadable → None).
    """
    if isinstance(num_points, bool) or not isinstance(num_points, int) or num_points < 1:
        raise ValueError(f"num_points must be an integer >= 1, got {num_points!r}")
    if not isinstance(text, str):
        return None
    headers = list(_SECTION_HEADER.finditer(text))
    section2 = [h for h in headers if h.group(1) == "2"]
    if not section2:
        return None
    last = section2[-1]
    section1 = [h for h in headers if h.group(1) == "1" and h.start() < last.start()]
    if not section1 or len(_VERDICT.findall(text, section1[0].end(), last.start())) < num_points:
        return None
    return _grade_lines(text[last.end() :].splitlines(), num_points)


def parse_numbered_grades(text: str, num_points: int) -> list[bool] | None:
    """Answer of the 'standard rubric' prompt: the whole answer is the numbered YES/NO list."""
    if isinstance(num_points, bool) or not isinstance(num_points, int) or num_points < 1:
        raise ValueError(f"num_points must be an integer >= 1, got {num_points!r}")
    if not isinstance(text, str):
        return None
    return _grade_lines(text.strip().splitlines(), num_points)


def _boxed_contents(text: str) -> list[str]:
    """Contents of every `\\boxed{...}` with balanced braces, in order (an unclosed one is skipped)."""
    contents = []
    for match in _BOXED.finditer(text):
        depth, start = 1, match.end()
        for position in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[position], 0)
            if depth == 0:
                contents.append(text[start:position])
                break
    return contents


def _number(text: str) -> float | None:
    text = re.sub(r"\\(?:text|mathrm|mathbf|textbf)\s*\{([^{}]*)\}", r"\1", text)
    text = text.replace("$", "").replace(" ", "").replace("\\,", "").replace("\\!", "")
    fraction = re.fullmatch(r"\\[dt]?frac\{(\d+)\}\{(\d+)\}", text)
    if fraction:
        text = f"{fraction.group(1)}/{fraction.group(2)}"
    if not re.fullmatch(r"\d+(\.\d*)?|\.\d+|\d+/\d+", text):
        return None
    try:
        return float(Fraction(text))
    except ZeroDivisionError:
        return None


def parse_boxed_score(text: str, allowed: Sequence[float] = (0.0, 0.5, 1.0)) -> float | None:
    """Score in the LAST `\\boxed{}` of a PAPO rubric answer (A.3), if it is one of `allowed`; else None.

    Accepts '1', '0.5', '.5', '1/2', '\\frac{1}{2}', '\\text{0.5}'. A value outside `allowed` is an unreadable
    answer, not something to clip or round.
    """
    if not allowed:
        raise ValueError("allowed scores must be a non-empty sequence, e.g. (0.0, 0.5, 1.0)")
    if not isinstance(text, str):
        return None
    boxes = _boxed_contents(text)
    if not boxes:
        return None
    value = _number(boxes[-1])
    if value is None:
        return None
    for score in allowed:
        if math.isclose(value, float(score), abs_tol=1e-9):
            return float(score)
    return None


def parse_rubric(text: str) -> list[str] | None:
    """Rubric items from the last complete `<rubric>…</rubric>` block: lines '1. …', '2. …' (continuation lines
    join the item above). None when the block is missing, empty or numbered out of order."""
    if not isinstance(text, str):
        return None
    blocks = _RUBRIC_BLOCK.findall(text)
    if not blocks:
        return None
    items: list[str] = []
    for line in blocks[-1].splitlines():
        match = _NUMBERED_ITEM.match(line)
        if match:
            if int(match.group(1)) != len(items) + 1:
                return None
            items.append(match.group(2).strip())
        elif line.strip():
            if not items:
                return None  # prose before item 1 is not a rubric
            items[-1] = f"{items[-1]} {line.strip()}".strip()
    if not items or any(not item for item in items):
        return None
    return items


def parse_graph(text: str, num_points: int) -> list[dict[str, list[int]]] | None:
    """Obsoletion rules from the last complete `<makes_obsolete_graph>` block (App. D), validated by
    `ReasoningGraph` (item numbers in 1..num_points, no rule obsoleting its own premise) and returned as the
    dataset records `[{"if_all": [4], "makes_obsolete": [2, 3]}, ...]`. An empty block is a valid empty graph."""
    from ppm_trl.points import ReasoningGraph  # imports torch: keep `import ppm_trl.judge` light

    if not isinstance(text, str):
        return None
    blocks = _GRAPH_BLOCK.findall(text)
    if not blocks:
        return None
    try:
        return ReasoningGraph.from_xml(f"<makes_obsolete_graph>{blocks[-1]}</makes_obsolete_graph>", num_points).to_records()
    except ValueError:
        return None


def parse_process_verdict(text: str) -> bool | None:
    """Process-reward baseline answer (App. D): the last `<conclusion>Correct|Incorrect</conclusion>`."""
    if not isinstance(text, str):
        return None
    verdicts = _CONCLUSION.findall(text)
    return None if not verdicts else verdicts[-1].lower() == "correct"


_ANSWER_TAG = re.compile(r"<\s*answer\s*>(.*?)<\s*/\s*answer\s*>", re.IGNORECASE | re.DOTALL)


def final_answer_of(reference: str) -> str | None:
    """The final answer a reference solution states: its last `\\boxed{}`, else its last `<answer>…</answer>`."""
    if not isinstance(reference, str):
        return None
    boxes = _boxed_contents(reference)
    if boxes and boxes[-1].strip():
        return boxes[-1].strip()
    tags = _ANSWER_TAG.findall(reference)
    return tags[-1].strip() if tags and tags[-1].strip() else None


def normalize_answer(text: str) -> str:
    """Loose LaTeX normal form for containment checks: no spaces, `$`, `\\left`/`\\right`, thin spaces."""
    text = re.sub(r"\\(?:left|right|displaystyle|,|!|;|:)", "", str(text))
    text = re.sub(r"\\[dt]frac", r"\\frac", text)
    return re.sub(r"[\s$]", "", text).rstrip(".").lower()


def answer_in_text(answer: str, text: str) -> bool:
    """Whether `text` (e.g. the last reasoning point) states `answer` (normalised containment)."""
    needle = normalize_answer(answer)
    return bool(needle) and needle in normalize_answer(text)
