"""Neutralise the judge's own markup inside untrusted text (policy rollouts, student solutions).

A rollout is written by the policy being trained, so it can contain — by accident or because RL found that it
pays — the very delimiters the judge prompt relies on: a `</rollout>` that ends the evidence early and smuggles
in instructions, a fake 'Section 2 – Grades' list of YES, prompt headers such as '# Instructions'. Each
neutraliser keeps the text readable (the judge still sees what the rollout says) but makes it impossible to
mistake for the prompt's structure:

- tags `<rollout>` / `</rollout>` (and `&lt;` forms) become `‹rollout›` / `‹/rollout›`;
- 'Section 2' becomes '§ 2', so neither the judge nor `parse_point_grades` can meet a section header in it;
- lines that mimic the prompt's headers or the judge's answer format (`# Rubric`, `Student solution:`, `-------`,
  `1. YES`, `Verdict: YES`, `## Evaluation`, `Score: ...`) are quoted with a leading '> '.

`\\boxed{}` is left alone in PAPO student solutions: it is how a student states the final answer, which the
judge must see; the score is read from the judge's *last* `\\boxed{}`, which follows its own 'Score:'.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_SECTION = re.compile(r"\bsection(?=\s*[-–—:.]?\s*\d)", re.IGNORECASE)

_PPM_LINES = re.compile(
    r"^(?=\s*[#*_]*\s*(?:"
    r"(?:problem\s+statement|partial\s+rollout|rubric|instructions|student\s+solution)\b"  # the prompts' headers
    r"|-{3,}\s*$"  # the standard rubric prompt's '-------' separators
    r"|\d+\s*[.):]\s*[*_]*\s*(?:yes|no)\b"  # a numbered grade line
    r"|(?:criterion|evidence|reason|verdict)\s*:"  # Section 1 fields
    r"))",
    re.IGNORECASE | re.MULTILINE,
)
_PPM_HEADERS = re.compile(r"^(?=\s*#)", re.MULTILINE)

_PAPO_LINES = re.compile(
    r"^(?=\s*[#*_]*\s*(?:"
    r"#+\s*(?:instruction|scoring\s+rubric|problem|reference\s+solution|student\s+solution|evaluation)\b"
    r"|(?:analysis|score)\s*:"
    r"))",
    re.IGNORECASE | re.MULTILINE,
)


def neutralize_tags(text: str, names: Iterable[str]) -> str:
    """`<name ...>`, `</name>` and their `&lt;`/`&gt;` spellings become `‹name›` / `‹/name›` (case-insensitive)."""
    alternatives = "|".join(names)
    pattern = re.compile(
        rf"(?:<|&lt;)\s*(/?)\s*({alternatives})\b([^<>]*?)\s*(/?)\s*(?:>|&gt;)",
        re.IGNORECASE,
    )
    return pattern.sub(lambda m: f"‹{m.group(1)}{m.group(2)}{m.group(3)}{m.group(4)}›", text)


def neutralize_sections(text: str) -> str:
    """'Section 2 – Grades' → '§ 2 – Grades': no section header of the PPM answer format survives."""
    return _SECTION.sub("§", text)


def quote_lines(text: str, pattern: re.Pattern[str]) -> str:
    """Prefix every line that `pattern` matches (at the line start) with '> '."""
    return pattern.sub("> ", text)


def escape_rollout(text: str) -> str:
    """Untrusted rollout text for the PPM grading (and standard rubric) prompt."""
    text = neutralize_tags(text, ["rollout"])
    text = neutralize_sections(text)
    text = quote_lines(text, _PPM_LINES)
    return quote_lines(text, _PPM_HEADERS)


def escape_papo_solution(text: str) -> str:
    """Untrusted student solution for the PAPO A.3 rubric prompt: its '## ...' headers and 'Score:' lines."""
    return quote_lines(text, _PAPO_LINES)


def escape_process_chunk(text: str) -> str:
    """Untrusted chunk for the process-reward prompt: its <part_i>, <analysis_i>, <conclusion> tags."""
    text = neutralize_tags(text, [r"part_\d+", r"analysis_\d+", "conclusion"])
    return quote_lines(text, _PPM_HEADERS)
