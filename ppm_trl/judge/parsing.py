"""Parsers for judge answers. Each returns None for an answer it cannot read with certainty — never a guess —
and None (never an exception) for any text at all.

A None makes the item unscorable (NaN reward, zero advantage, counted), which is better than a silent 0 or a
grade read from the wrong place: the PPM answer quotes the rollout verbatim in Section 1, so a rollout that
contains its own "Section 2 – Grades / 1. YES" list would otherwise be read as the verdict. Hence the PPM parser
skips everything inside an `Evidence:` quote (up to the judge's next `Reason:`/`Verdict:` line), so an answer cut
off inside a quote (max_tokens) is unreadable rather than graded by what the rollout planted there, and the PAPO
parser reads the box of the judge's own last `Score:` line, not a box quoted from the student.

The parsers run on the judge's event-loop thread, so every one is linear in the answer's length (no regex that
backtracks on long runs, no quadratic scan) and an answer longer than `MAX_ANSWER_CHARS` is refused unread.
Item numbers longer than `_MAX_DIGITS` are unreadable, never converted (Python refuses int() on ~4,300 digits).
"""

from __future__ import annotations

import logging
import math
import re
import unicodedata
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

from ppm_trl.text import boxed_spans

logger = logging.getLogger(__name__)

# ~60k tokens, far above a judge's max_tokens; a longer answer is unreadable (None) without being looked at, which
# bounds how long one parse can hold the event loop (~0.1 s for 250k characters of `\boxed{` on one core).
MAX_ANSWER_CHARS = 250_000
_MAX_DIGITS = 9  # item numbers and score numerators/denominators

# Line breaks as str.splitlines() sees them (the escaper maps all of them to "\n" before it looks at line starts).
_LINE_BREAK = re.compile(r"\r\n|[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")
_SECTION_HEADER = re.compile(r"[ \t#*_]*section[ \t]*([12])\b", re.IGNORECASE)
# No two neighbouring repeats can match the same characters, so a long run of spaces cannot make this backtrack.
GRADE_LINE = re.compile(r"[ \t*_]*([0-9]+)(?:[ \t*_]*[.):])?[ \t*_]*(yes|no)[ \t*_.]*", re.IGNORECASE | re.ASCII)
_EVIDENCE = re.compile(r"[ \t*_#]*(?:[0-9]+(?:[ \t]*[.):])?[ \t*_]*)?evidence[ \t*_]*:", re.IGNORECASE)
_FIELD_AFTER_EVIDENCE = re.compile(r"[ \t*_#]*(?:[0-9]+(?:[ \t]*[.):])?[ \t*_]*)?(reason|verdict)[ \t*_]*:", re.IGNORECASE)
_FENCE = re.compile(r"[ \t]*(```\w*|~~~)[ \t]*")
_SCORE_LABEL = re.compile(r"[ \t*_#]*(?:final[ \t]+)?score[ \t*_]*:", re.IGNORECASE)
_NUMBERED_ITEM = re.compile(r"[ \t]*([0-9]+)[ \t]*[.)][ \t]*(.*)")
_CONCLUSION = re.compile(r"<\s*conclusion\s*>\s*(correct|incorrect)[\s.]*<\s*/\s*conclusion\s*>", re.IGNORECASE)


def _guarded(read: Callable[..., Any], *args: Any) -> Any:
    """`read(*args)`, or None if it raises: a parser defect makes one answer unscorable (logged with its
    traceback), never the whole batch — `LiteLLMJudge` re-raises anything it does not classify as a judge error."""
    try:
        return read(*args)
    except Exception:  # noqa: BLE001 - logged; the answer counts as unreadable
        logger.warning("judge answer parser %s raised; the answer counts as unreadable", getattr(read, "__name__", read),
                       exc_info=True)
        return None


def _readable(text: object) -> bool:
    return isinstance(text, str) and len(text) <= MAX_ANSWER_CHARS


def _lines(text: str) -> list[str]:
    return _LINE_BREAK.split(text)


def _ordinal(digits: str) -> int | None:
    """An item number, or None when it has more digits than any rubric (never int() on 5,000 digits)."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= _MAX_DIGITS else None


def read_grade_line(line: str) -> tuple[int | None, bool] | None:
    """`'2. YES'`, `'**2.** no.'`, `'* *2 YES'` → (2, True/False); None for anything else. The number is None
    when it is too long to be an item number. Shared with the escaper, which quotes every line this reads."""
    match = GRADE_LINE.fullmatch(line)
    if match is None:
        return None
    return _ordinal(match.group(1)), match.group(2).lower() == "yes"


def _grade_lines(lines: Sequence[str], num_points: int) -> list[bool] | None:
    """A numbered YES/NO list 1..num_points (blank lines and code fences allowed in between), or None."""
    grades: list[bool] = []
    for line in lines:
        if not line.strip() or _FENCE.fullmatch(line):
            continue
        grade = read_grade_line(line)
        if grade is None or grade[0] != len(grades) + 1:
            return None
        grades.append(grade[1])
    return grades if len(grades) == num_points else None


def _check_num_points(num_points: object) -> None:
    if isinstance(num_points, bool) or not isinstance(num_points, int) or num_points < 1:
        raise ValueError(f"num_points must be an integer >= 1, got {num_points!r}")


def parse_point_grades(text: str, num_points: int, points: Sequence[str] | None = None,
                       rollout: str | None = None) -> list[bool] | None:
    """PPM grading answer (App. D) → one bool per rubric point, read ONLY from the final 'Section 2' list.

    Lines inside an `Evidence:` quote (from the `Evidence:` line to the next line starting `Reason:` or
    `Verdict:`) are not the judge's own structure and are skipped. Outside them, requires a 'Section 1' header
    before the last 'Section 2' header with at least `num_points` `Verdict:` lines between them (a completed
    Section 1), and after it exactly the lines `1. YES|NO` … `num_points. YES|NO` and nothing else. Only the bare
    word YES grades a point as reached ('YES, partially' is unreadable → None).

    Checks that the answer is for THIS request (a server that mixes up answers must not grade the wrong rollout):
    with `points` (the rubric as the prompt showed it), every Section 1 `N. Criterion:` line must restate point N
    (compared on letters and digits only; numbers beyond `num_points` fail); with `rollout` (the text the prompt
    showed), the evidence quotes must come from it — an answer most of whose quoted fragments (16+ letters and
    digits between ellipses) are not in the rollout is refused. A refused answer is None, like an unreadable one.
    """
    _check_num_points(num_points)
    if points is not None and len(points) != num_points:
        raise ValueError(f"points has {len(points)} items but num_points is {num_points}")
    return _guarded(_point_grades, text, num_points, points, rollout)


_CRITERION = re.compile(r"[ \t*_#]*([0-9]+)(?:[ \t]*[.):])?[ \t*_]*criterion[ \t*_]*:(.*)", re.IGNORECASE)
_ELLIPSIS = re.compile(r"\[?(?:\.\.\.|…)\]?")
_MIN_FRAGMENT = 16  # letters and digits: shorter quotes ("x = 2") match anywhere and prove nothing


def comparable(text: str) -> str:
    """`text` reduced to its letters and digits, case-folded: what a restated criterion or a quote is compared
    on (a judge may change whitespace, Markdown or quote marks)."""
    return "".join(c for c in unicodedata.normalize("NFKC", text).casefold() if c.isalnum())


def _criteria_match(criteria: list[tuple[str, str]], points: Sequence[str]) -> bool:
    for number, restated in criteria:
        index = _ordinal(number)
        if index is None or not 1 <= index <= len(points):
            return False
        said, asked = comparable(restated), comparable(points[index - 1])
        if not said:
            continue
        shorter = min(len(said), len(asked))
        if not (said == asked or (shorter >= 12 and (said in asked or asked in said)) or
                (shorter >= 24 and said[:24] == asked[:24])):
            return False
    return True


def _quotes_match(quotes: list[str], rollout: str) -> bool:
    source = comparable(rollout)
    fragments = [comparable(piece) for quote in quotes for piece in _ELLIPSIS.split(quote)]
    fragments = [f.strip("\"'") for f in fragments if len(f) >= _MIN_FRAGMENT and "notpresentinrollout" not in f]
    found = sum(1 for fragment in fragments if fragment in source)
    return 2 * found >= len(fragments)


def _point_grades(text: str, num_points: int, points: Sequence[str] | None = None,
                  rollout: str | None = None) -> list[bool] | None:
    if not _readable(text):
        return None
    own: list[str] = []  # the judge's own lines, evidence quotes removed
    quotes: list[str] = []  # the evidence quotes
    criteria: list[tuple[str, str]] = []  # (number, restated criterion) of Section 1
    in_evidence = False
    for line in _lines(text):
        if in_evidence and _FIELD_AFTER_EVIDENCE.match(line):
            in_evidence = False
        elif evidence := _EVIDENCE.match(line):
            in_evidence = True
            quotes.append(line[evidence.end():])
        elif in_evidence:
            quotes[-1] += "\n" + line
        if not in_evidence:
            own.append(line)
            if points is not None and (criterion := _CRITERION.match(line)):
                criteria.append((criterion.group(1), criterion.group(2)))
    headers = [(index, match.group(1)) for index, line in enumerate(own) if (match := _SECTION_HEADER.match(line))]
    section2 = [index for index, number in headers if number == "2"]
    if not section2:
        return None
    last = section2[-1]
    section1 = [index for index, number in headers if number == "1" and index < last]
    if not section1:
        return None
    verdicts = sum(1 for line in own[section1[0] + 1 : last] if (m := _FIELD_AFTER_EVIDENCE.match(line)) and m.group(1).lower() == "verdict")
    if verdicts < num_points:
        return None
    grades = _grade_lines(own[last + 1 :], num_points)
    if grades is None:
        return None
    if points is not None and not _criteria_match(criteria, points):
        return None
    if rollout is not None and not _quotes_match(quotes, rollout):
        return None
    return grades


def parse_numbered_grades(text: str, num_points: int) -> list[bool] | None:
    """Answer of the 'standard rubric' prompt: the whole answer is the numbered YES/NO list."""
    _check_num_points(num_points)
    if not _readable(text):
        return None
    return _guarded(lambda: _grade_lines(_lines(text.strip()), num_points))


def _last_closed_box(text: str) -> str | None:
    """Content of the last `\\boxed{...}` that is closed (an unclosed one is skipped); linear time."""
    closed = [(start, end) for start, end in boxed_spans(text) if end is not None]
    return text[closed[-1][0] : closed[-1][1]] if closed else None


# Scores are small: at most 9 digits before the point or in a fraction's terms, 20 after the point.
_NUMBER = re.compile(r"[0-9]{1,9}(?:\.[0-9]{0,20})?|\.[0-9]{1,20}|[0-9]{1,9}/[0-9]{1,9}")


def _number(text: str) -> float | None:
    if len(text) > 200:  # no score is written with more characters; keeps the regexes below cheap
        return None
    text = re.sub(r"\\(?:text|mathrm|mathbf|textbf)\s*\{([^{}]*)\}", r"\1", text)
    text = text.replace("$", "").replace(" ", "").replace("\\,", "").replace("\\!", "")
    fraction = re.fullmatch(r"\\[dt]?frac\{([0-9]+)\}\{([0-9]+)\}", text)
    if fraction:
        text = f"{fraction.group(1)}/{fraction.group(2)}"
    if not _NUMBER.fullmatch(text):
        return None
    try:
        return float(Fraction(text))
    except ZeroDivisionError:
        return None


def parse_boxed_score(text: str, allowed: Sequence[float] = (0.0, 0.5, 1.0)) -> float | None:
    """Score in the last `\\boxed{}` after the judge's last `Score:` line of a PAPO rubric answer (A.3), if it is
    one of `allowed`; else None.

    The `Score:` label must start a line (decoration such as `**Score:**` or `Final score:` is fine): a box the
    judge merely quotes from the student (their final answer, or a `> Score: \\boxed{1}` the escaper quoted) is
    not a score, even when the answer is cut off right after it. Accepts '1', '0.5', '.5', '1/2',
    '\\frac{1}{2}', '\\text{0.5}'. A value outside `allowed` is an unreadable answer, not something to clip.
    """
    if not allowed:
        raise ValueError("allowed scores must be a non-empty sequence, e.g. (0.0, 0.5, 1.0)")
    return _guarded(_boxed_score, text, tuple(float(score) for score in allowed))


def _boxed_score(text: str, allowed: tuple[float, ...]) -> float | None:
    if not _readable(text):
        return None
    start = None
    offset = 0
    for line, separator in _lines_with_ends(text):
        label = _SCORE_LABEL.match(line)
        if label is not None:
            start = offset + label.end()
        offset += len(line) + len(separator)
    if start is None:
        return None
    box = _last_closed_box(text[start:])
    value = None if box is None else _number(box)
    if value is None:
        return None
    for score in allowed:
        if math.isclose(value, score, abs_tol=1e-9):
            return score
    return None


def _lines_with_ends(text: str):
    """(line, the line break after it) pairs, so line offsets can be recovered."""
    position = 0
    for match in _LINE_BREAK.finditer(text):
        yield text[position : match.start()], match.group()
        position = match.end()
    yield text[position:], ""


def _last_block(text: str, name: str) -> str | None:
    """Content of the last complete `<name>…</name>` block, in linear time: the last opening tag before the last
    closing tag, up to the first closing tag after it (a lazy `<name>(.*?)</name>` regex would rescan the rest of
    the text from every unclosed `<name>`)."""
    closings = list(re.finditer(rf"<\s*/\s*{name}\s*>", text, re.IGNORECASE))
    if not closings:
        return None
    openings = list(re.finditer(rf"<\s*{name}\s*>", text[: closings[-1].start()], re.IGNORECASE))
    if not openings:
        return None
    start = openings[-1].end()
    end = next(match.start() for match in closings if match.start() >= start)
    return text[start:end]


def parse_rubric(text: str) -> list[str] | None:
    """Rubric items from the last complete `<rubric>…</rubric>` block: lines '1. …', '2. …' (continuation lines
    join the item above). None when the block is missing, empty or numbered out of order."""
    return _guarded(_rubric, text)


def _rubric(text: str) -> list[str] | None:
    if not _readable(text):
        return None
    block = _last_block(text, "rubric")
    if block is None:
        return None
    items: list[str] = []
    for line in _lines(block):
        match = _NUMBERED_ITEM.fullmatch(line)
        if match:
            if _ordinal(match.group(1)) != len(items) + 1:
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
    _check_num_points(num_points)
    return _guarded(_graph, text, num_points)


def _graph(text: str, num_points: int) -> list[dict[str, list[int]]] | None:
    from ppm_trl.points import ReasoningGraph  # imports torch: keep `import ppm_trl.judge` light

    if not _readable(text):
        return None
    block = _last_block(text, "makes_obsolete_graph")
    if block is None:
        return None
    try:
        graph = ReasoningGraph.from_xml(f"<makes_obsolete_graph>{block}</makes_obsolete_graph>", num_points)
    except ValueError:
        return None
    return graph.to_records()


def parse_process_verdict(text: str) -> bool | None:
    """Process-reward baseline answer (App. D): the last `<conclusion>Correct|Incorrect</conclusion>`."""
    if not _readable(text):
        return None
    verdicts = _guarded(_CONCLUSION.findall, text)
    return None if not verdicts else verdicts[-1].lower() == "correct"


def final_answer_of(reference: str) -> str | None:
    """The final answer a reference solution states: its last closed `\\boxed{}`, else its last
    `<answer>…</answer>` (linear time, whatever the reference holds)."""
    if not isinstance(reference, str):
        return None
    box = _last_closed_box(reference)
    if box is not None and box.strip():
        return box.strip()
    tag = _last_block(reference, "answer")
    return tag.strip() if tag is not None and tag.strip() else None


def loose_latex_form(text: str) -> str:
    """Loose LaTeX normal form for containment checks: no spaces, `$`, `\\left`/`\\right`, thin spaces."""
    text = re.sub(r"\\(?:left|right|displaystyle|,|!|;|:)", "", str(text))
    text = re.sub(r"\\[dt]frac", r"\\frac", text)
    return re.sub(r"[\s$]", "", text).rstrip(".").lower()


def answer_in_text(answer: str, text: str) -> bool:
    """Whether `text` (e.g. the last reasoning point) states `answer` (normalised containment)."""
    needle = loose_latex_form(answer)
    return bool(needle) and needle in loose_latex_form(text)
