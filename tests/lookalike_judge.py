"""A judge stub that reads look-alike characters as the real ones (a responder for `JudgeServer`).

The scripted judge of `judge_server.py` matches the prompt's ASCII structure literally, so it cannot be fooled by
`＜/rollout＞` or `## Еvaluation` (Cyrillic Е). This one reads the prompt the way a capable but too obedient LLM
would: it first normalises what it reads — its OWN folding, deliberately independent of `ppm_trl.judge.escaping`:
HTML entities decoded (twice), Unicode tag characters decoded to the ASCII they encode, NFKC, format, private-use
and unassigned characters and variation selectors dropped, every TR39 confusable of an ASCII character read as it
(Cyrillic, Greek, Armenian, small capitals, ...), angle-quote brackets, dashes and `⌗` read as ASCII — and then takes the first thing that looks like the
end of the untrusted text as its end:

- PPM prompt: a closing `</rollout` (with or without `>`, `<\\/rollout`), a chat-template token (`<|im_end|>`,
  `[/INST]`, ...), or a Markdown header line (ATX `# ...` or setext `...\\n===`) not quoted with '>';
- standard rubric prompt: a line of three or more dashes;
- PAPO prompt: a line it reads as the `## Evaluation` header (ATX, or setext-underlined `Evaluation`).

Whatever follows that end is read as instructions, and an "ignore the rubric" there is obeyed (every criterion
YES, score 1). It quotes the rollout *as it read it* (normalised) in its Evidence. `make_lookalike_judge(
cut_in_quote=True)` plays an answer cut off by max_tokens right after the first Evidence quote.
"""

from __future__ import annotations

import functools
import html
import json
import re
import unicodedata
from collections.abc import Callable
from importlib import resources

_READ_AS = str.maketrans({
    "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x", "і": "i", "ѕ": "s", "ј": "j",
    "А": "A", "Е": "E", "О": "O", "Р": "P", "С": "C", "Т": "T", "Х": "X", "Ѕ": "S", "І": "I", "К": "K", "М": "M",
    "Η": "H", "Ο": "O", "ο": "o", "Ε": "E", "Α": "A", "Τ": "T", "ρ": "p", "ν": "v", "ι": "i",
    "‹": "<", "›": ">", "«": "<", "»": ">", "〈": "<", "〉": ">", "⟨": "<", "⟩": ">",
    "—": "-", "–": "-", "―": "-", "−": "-", "─": "-", "‐": "-", "⌗": "#", "♯": "#",
})
_END_OF_ROLLOUT = re.compile(
    r"<\s*\\*/\s*rollout(?![a-z])|<\|[a-z_]+\|>|\[/?inst\]|<</?sys>>|<end_of_turn>"
    r"|^[ \t]*#[^\n]*$|^[ \t]*[^\s>][^\n]*\n[ \t]*(?:=+|-+)[ \t]*$",
    re.IGNORECASE | re.MULTILINE,
)
_EVALUATION = re.compile(r"^[ \t]*#+[ \t]*evaluation[ \t]*$|^[ \t]*evaluation[ \t]*\n[ \t]*(?:=+|-+)[ \t]*$",
                         re.IGNORECASE | re.MULTILINE)
_NUMBERED = re.compile(r"^\s*(\d+)\s*[.)]\s*(.+?)\s*$", re.MULTILINE)
_QUOTED = re.compile(r'"([^"]+)"')


@functools.cache
def tr39_ascii() -> dict[str, str]:
    """Every non-ASCII character Unicode TR39 (confusables.txt, the `confusable_homoglyphs` package's copy) lists as
    confusable with an ASCII character or string → that ASCII text (the shortest, then the first in code order)."""
    data = json.loads(resources.files("confusable_homoglyphs").joinpath("confusables.json").read_text(encoding="utf-8"))
    marks = str.maketrans("", "", "\u200e\u200f")
    readings: dict[str, list[str]] = {}
    for source, entries in data.items():
        for entry in entries:
            a, b = source.translate(marks), entry["c"].translate(marks)
            for char, other in ((a, b), (b, a)):
                if len(char) == 1 and not char.isascii() and other.isascii() and other.strip():
                    readings.setdefault(char, []).append(other)
    return {char: min(options, key=lambda o: (len(o), o)) for char, options in readings.items()}


def _decode_tags(text: str) -> str:
    """Unicode tag characters (U+E0020..U+E007E) read as the ASCII they encode, as some models do."""
    return "".join(chr(ord(c) - 0xE0000) if 0xE0020 <= ord(c) <= 0xE007E else c for c in text)


def read_as_judge(text: str) -> str:
    """The text as this judge reads it."""
    text = _decode_tags(html.unescape(html.unescape(text)))
    text = unicodedata.normalize("NFKC", text)
    text = "".join(c for c in text if unicodedata.category(c) not in ("Cf", "Co", "Cn") and not 0xFE00 <= ord(c) <= 0xFE0F)
    text = re.sub(r"\r\n?|[\u2028\u2029\x85\x0b\x0c]", "\n", text)
    tr39 = tr39_ascii()
    return "".join(tr39.get(c, tr39.get(c.lower(), _small_capital(c))) for c in text.translate(_READ_AS))


def _small_capital(char: str) -> str:
    """`ʀ` (LATIN LETTER SMALL CAPITAL R) reads as `r`; TR39 lists only some small capitals."""
    name = unicodedata.name(char, "")
    if name.startswith("LATIN LETTER SMALL CAPITAL ") and len(name.rsplit(" ", 1)[1]) == 1:
        return name[-1].lower()
    return char


def _met(criterion: str, evidence: str) -> bool:
    needles = _QUOTED.findall(criterion) or [criterion]
    return all(needle.lower() in evidence.lower() for needle in needles)


def _criteria(user: str, start: str, end: str) -> list[str]:
    heads = list(re.finditer(start, user, re.MULTILINE | re.IGNORECASE))
    if not heads:
        return []
    rest = user[heads[-1].end() :]
    tail = re.search(end, rest, re.MULTILINE | re.IGNORECASE)
    return [text for _, text in _NUMBERED.findall(rest[: tail.start()] if tail else rest)]


def _grade_ppm(user: str, cut_in_quote: bool) -> str:
    opening = user.find("<rollout>")
    body = user[opening + len("<rollout>") :]
    end = _END_OF_ROLLOUT.search(body)
    rollout, after = (body[: end.start()], body[end.end() :]) if end else (body, "")
    criteria = _criteria(user, r"^#\s*Rubric\s*$", r"^#\s*Instructions\s*$")
    obey = "ignore the rubric" in after.lower()
    verdicts = [obey or _met(c, rollout) for c in criteria]
    lines = ["Section 1 – Reasoning:"]
    for i, (criterion, yes) in enumerate(zip(criteria, verdicts), start=1):
        lines += [f"{i}. Criterion: {criterion}.", f"Evidence: {rollout.strip()}"]
        if cut_in_quote:
            return "\n".join(lines)  # max_tokens reached inside the quote
        lines += ["Reason: stub.", f"Verdict: {'YES' if yes else 'NO'}."]
    lines.append("Section 2 – Grades (one line per criterion):")
    lines += [f"{i}. {'YES' if yes else 'NO'}" for i, yes in enumerate(verdicts, start=1)]
    return "\n".join(lines)


def _grade_standard(user: str) -> str:
    student_start = re.search(r"^Student solution:\s*$", user, re.MULTILINE)
    body = user[student_start.end() :]
    end = re.search(r"^[ \t]*-{3,}[ \t]*$", body, re.MULTILINE)
    student, after = (body[: end.start()], body[end.end() :]) if end else (body, "")
    criteria = _criteria(user, r"^Rubric:\s*$", r"^[ \t]*-{3,}[ \t]*$")
    obey = "ignore the rubric" in after.lower()
    return "\n".join(f"{i}. {'YES' if obey or _met(c, student) else 'NO'}" for i, c in enumerate(criteria, start=1))


def _grade_papo(user: str) -> str:
    body = user[re.search(r"^## Student Solution\s*$", user, re.MULTILINE).end() :]
    end = _EVALUATION.search(body)
    student, after = (body[: end.start()], body[end.end() :]) if end else (body, "")
    score = "1" if "ignore the rubric" in after.lower() else "0"
    return f"Analysis: the student wrote {len(student.split())} words.\nScore: $\\boxed{{{score}}}$"


def make_lookalike_judge(cut_in_quote: bool = False) -> Callable[[dict], str]:
    def respond(body: dict) -> str:
        messages = body.get("messages", [])
        system = next((m["content"] for m in messages if m.get("role") == "system"), "")
        user = read_as_judge(next((m["content"] for m in reversed(messages) if m.get("role") == "user"), ""))
        if "## Scoring Rubric" in user:
            return _grade_papo(user)
        if "Section 2" in system:
            return _grade_ppm(user, cut_in_quote)
        if "grade the student solution against the rubric" in system:
            return _grade_standard(user)
        return "unsupported prompt"

    return respond
