"""Neutralise the judge's own markup inside untrusted text (policy rollouts, student solutions).

A rollout is written by the policy being trained, so it can contain — by accident or because RL found that it
pays — the very delimiters the judge prompt relies on: a `</rollout>` that ends the evidence early and smuggles
in instructions, a fake 'Section 2 – Grades' list of YES, prompt headers such as '# Instructions', a chat
template's role tokens. Each neutraliser keeps the text readable (the judge still sees what the rollout says)
but makes it impossible to mistake for the prompt's structure:

- tags `<rollout>` / `</rollout>` (also without `>`, with `<\\/`, as `&lt;` entities) become `(rollout)` /
  `(/rollout)`; chat-template tokens (`<|im_end|>`, `<|eot_id|>`, `[INST]`, `<<SYS>>`, `<end_of_turn>`, ...)
  get round brackets the same way;
- 'Section 2' becomes '§ 2', so neither the judge nor `parse_point_grades` can meet a section header in it;
- lines that mimic the prompt's headers or the judge's answer format (`# Rubric`, `Student solution:`, `-------`,
  a setext `====` underline, `1. YES`, `* *2 YES`, `Verdict: YES`, `## Evaluation`, `Score: ...`) are quoted
  with a leading '> '.

Hidden characters. Whatever prints as nothing is removed from the untrusted text before anything else
(`strip_hidden`): format characters (zero-width, bidi controls, soft hyphen, Unicode tag characters, which some
models decode as the ASCII they shadow), private-use characters, surrogates, control characters other than tab and
line breaks, variation selectors and every other default-ignorable code point.

Look-alikes. A judge model reads `＜/rollout＞`, `</rоllout>` (Cyrillic о), `</rօllօսt>` (Armenian), `&#60;/rollout>`
or `## Evaluation` written with `⌗` as the real thing. So the patterns are matched on a *folded* copy of the text —
per character NFKC with combining marks dropped, unassigned code points dropped, HTML entities decoded, every
character that Unicode TR39 (confusables.txt) lists as confusable with ASCII read as that ASCII, plus rules by
Unicode property for what TR39 does not list (dashes, angle brackets and quotes, number signs, small capitals),
every Unicode line break read as '\\n' — and each match is neutralised in the ORIGINAL text at the place it came
from. Tag names also match their ASCII look-alikes (`</ro11out>`). Text that matches nothing passes through
unchanged (x², π, accents and Cyrillic prose stay as written); the neutral forms use ASCII round brackets, which
no look-alike reading turns back into a tag.

`\\boxed{}` is left alone in PAPO student solutions: it is how a student states the final answer, which the
judge must see; the score is read from the box on the judge's own last 'Score:' line.
"""

from __future__ import annotations

import bisect
import functools
import html
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence

from ppm_trl.judge.parsing import GRADE_LINE

# --------------------------------------------------------------------------------------------------- folding
_LINE_BREAKS = frozenset("\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
# Default_Ignorable_Code_Point (Unicode DerivedCoreProperties) that are not Cf/Co/Cn/Cs, so no category rule finds
# them: variation selectors, the combining grapheme joiner, Khmer inherent vowels, Hangul fillers (letters that print
# as nothing); plus the braille blank, which prints as nothing too.
_IGNORABLE_RANGES = ((0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x3164, 0x3164),
                     (0xFE00, 0xFE0F), (0xFFA0, 0xFFA0), (0x2800, 0x2800), (0xE0000, 0xE0FFF))
# Unassigned code points that Unicode reserves as default-ignorable (and noncharacters): stripped from the text
# too. Other unassigned code points may be characters of a newer Unicode than Python's, so they are only
# ignored while matching (see `is_invisible`).
_RESERVED_IGNORABLE = ((0x2065, 0x2065), (0xFFF0, 0xFFF8), (0xFDD0, 0xFDEF), (0xE0000, 0xE0FFF))
_TAG_ASCII = range(0xE0020, 0xE007F)  # TAG SPACE .. TAG TILDE: invisible copies of ASCII that models decode


def _in(ranges: tuple[tuple[int, int], ...], code: int) -> bool:
    return any(low <= code <= high for low, high in ranges)


@functools.lru_cache(maxsize=16384)
def is_hidden(char: str) -> bool:
    """Whether `char` is stripped from untrusted text before it goes into a prompt: it prints as nothing (or has
    no agreed glyph) yet a model may read it. The rule: general category Cf (format: zero-width characters, bidi
    controls, tag characters, soft hyphen, invisible operators), Co (private use), Cs (surrogates), Cc other than
    tab and line breaks, every Default_Ignorable_Code_Point that is not one of those (variation selectors,
    combining grapheme joiner, Hangul fillers, ...), the unassigned code points Unicode reserves as
    default-ignorable, and noncharacters."""
    if char in _LINE_BREAKS or char in "\t\n":
        return False
    code = ord(char)
    category = unicodedata.category(char)
    if category in ("Cf", "Co", "Cs", "Cc") or _in(_IGNORABLE_RANGES, code):
        return True
    return category == "Cn" and (_in(_RESERVED_IGNORABLE, code) or (code & 0xFFFE) == 0xFFFE)


def is_invisible(char: str) -> bool:
    """What the folding drops while matching: every hidden character (`is_hidden`) and every unassigned code point."""
    return is_hidden(char) or unicodedata.category(char) == "Cn"


@functools.cache
def _confusables() -> dict[str, tuple[str, ...]]:
    """Unicode TR39 confusables (confusables.txt, as shipped by the `confusable_homoglyphs` package): each
    character or sequence → the ones it is confusable with (both directions of each source → prototype line)."""
    import json
    from importlib import resources

    try:
        data = resources.files("confusable_homoglyphs").joinpath("confusables.json").read_text(encoding="utf-8")
    except ModuleNotFoundError:  # pragma: no cover - a declared dependency
        raise ImportError("ppm_trl.judge needs the TR39 confusables data of `confusable_homoglyphs` "
                          "(pip install confusable-homoglyphs==3.3.1)") from None
    bidi_marks = str.maketrans("", "", "\u200e\u200f")  # the package's parser keeps the marks around RTL characters
    partners: dict[str, set[str]] = {}
    for source, entries in json.loads(data).items():
        for entry in entries:
            a, b = source.translate(bidi_marks), entry["c"].translate(bidi_marks)
            if a and b and a != b:
                partners.setdefault(a, set()).add(b)
                partners.setdefault(b, set()).add(a)
    return {char: tuple(sorted(others, key=lambda o: (len(o), o))) for char, others in partners.items()}


# Look-alikes TR39 does not list, by Unicode property or name rather than one by one.
_SMALL_CAPITAL_OR_HOOKED = re.compile(r"LATIN (?:LETTER SMALL CAPITAL|SMALL LETTER|CAPITAL LETTER) ([A-Z])(?: WITH .*)?")
_NUMBER_SIGNS = frozenset("\u2317\u22d5")  # VIEWDATA SQUARE ⌗, EQUAL AND PARALLEL TO ⋕: drawn as '#'; TR39 lists none


def _by_property(char: str) -> str | None:
    """The ASCII character `char` is drawn as, by its Unicode category or name (TR39 gaps: dashes, angle brackets
    and quotes, number signs, small capitals and letters with a hook or bar)."""
    category = unicodedata.category(char)
    name = unicodedata.name(char, "")
    if category == "Pd" or name.endswith(" HORIZONTAL") or "HORIZONTAL LINE" in name or "HORIZONTAL BAR" in name:
        return "-"
    if re.search(r"\bANGLE\b", name) and category in ("Ps", "Pi", "Pe", "Pf"):
        return "<" if category in ("Ps", "Pi") else ">"
    if char in _NUMBER_SIGNS or "NUMBER SIGN" in name or "SHARP SIGN" in name:
        return "#"
    if "SOLIDUS" in name and category in ("Sm", "Po", "So"):
        return "\\" if "REVERSE SOLIDUS" in name else "/"
    if category[0] in "SP" and ("VERTICAL LINE" in name or "VERTICAL BAR" in name or name.endswith(" VERTICAL")):
        return "|"
    letter = _SMALL_CAPITAL_OR_HOOKED.fullmatch(name)
    return letter.group(1).lower() if letter and category[0] == "L" else None


def _pick(char: str, options: Sequence[str]) -> str:
    """One ASCII reading among TR39's (the l/I/1/| prototype is '|' for a symbol, 'l' for a letter)."""
    if "l" in options and unicodedata.category(char)[0] in "SP":
        return "|"
    return options[0]


def _ascii_form(char: str) -> str | None:
    """`char`'s NFKC form when that is visible ASCII, else what the property rules read it as."""
    normal = unicodedata.normalize("NFKC", char)
    if normal != char and normal.isascii() and normal.strip():
        return normal
    return _by_property(char)


@functools.lru_cache(maxsize=16384)
def ascii_reading(char: str) -> str | None:
    """The ASCII text a look-alike-reading judge takes the non-ASCII `char` for, or None: its NFKC form if that is
    ASCII; else its TR39 confusable that is ASCII; else the property rules (`_by_property`); else the same for its
    NFKC form and for its TR39 confusables (one hop: Cyrillic `т` → small capital `ᴛ` → `t`)."""
    reading = _ascii_form(char)
    if reading is not None and reading == unicodedata.normalize("NFKC", char):
        return reading
    partners = _confusables().get(char, ())
    ascii_partners = [p for p in partners if p.isascii() and p.isprintable() and p.strip()]
    if ascii_partners:
        return _pick(char, ascii_partners)
    if reading is not None:
        return reading
    normal = unicodedata.normalize("NFKC", char)
    if len(normal) == 1 and normal != char and not normal.isascii():
        reading = ascii_reading(normal)
    for partner in partners:
        if reading is not None:
            break
        if len(partner) == 1 and not partner.isascii():
            reading = _ascii_form(partner)
    return reading


def _read(char: str) -> str:
    if char.isascii():
        return char
    lower = char.lower()
    for candidate in ((lower, char) if len(lower) == 1 and lower != char else (char,)):
        reading = ascii_reading(candidate)
        if reading is not None:
            return reading
    return char


# An HTML entity (`&amp;` prefixes decoded too): folds to another length, so it needs its own span.
_ENTITY = r"&((?:amp;)*)(#[0-9]{1,8};?|#[xX][0-9a-fA-F]{1,8};?|[A-Za-z][A-Za-z0-9]{1,31};?)"
_ASCII_INVISIBLE = "".join(map(chr, [*range(0, 9), *range(0x0E, 0x1C), 0x1F, 0x7F]))
_ASCII_FOLDABLE = re.compile(r"[&\r\x0b\x0c\x1c-\x1e" + re.escape(_ASCII_INVISIBLE) + "]")
_ASCII_LINE_BREAKS = dict.fromkeys("\r\x0b\x0c\x1c\x1d\x1e", "\n")  # '\r\n' reads as '\n\n': the same lines


@functools.lru_cache(maxsize=16384)
def fold_char(char: str) -> str:
    """What a look-alike-reading judge takes one character for ('' for an invisible one): line breaks read as
    '\n', hidden and unassigned characters as nothing (a tag character as the ASCII it encodes), spaces as ' ',
    then per character NFKD with combining marks dropped and each character's ASCII reading (`ascii_reading`)."""
    if char in _LINE_BREAKS:
        return "\n"
    if is_invisible(char):
        return chr(ord(char) - 0xE0000) if ord(char) in _TAG_ASCII else ""
    if unicodedata.category(char) == "Zs":
        return " "
    whole = _read(char)  # a character TR39 reads as ASCII, before its decomposition hides that (`ϲ`, `ͺ`)
    if whole.isascii():
        return whole
    kept = "".join(
        c for c in unicodedata.normalize("NFKD", char) if unicodedata.category(c) not in ("Mn", "Me") and not is_invisible(c)
    )
    return "".join(map(_read, unicodedata.normalize("NFC", kept)))


class Folded:
    """The folded copy of `text` (`.folded`) and, for each of its characters, the span of `text` it came from.

    The map is kept as segments (folded start, original start, original end or None): a None segment maps its
    characters one for one (ASCII, θ, π, Cyrillic), any other maps all of its characters to one original span (an
    entity, a ligature, `\\r\\n`, a dropped zero-width character). Lookups bisect the segment starts.
    """

    def __init__(self, text: str):
        self.text = text
        self._folded_starts: list[int] = [0]
        self._original_starts: list[int] = [0]
        self._original_ends: list[int | None] = [None]
        if text.isascii() and not _ASCII_FOLDABLE.search(text):  # the common case: folding changes nothing
            self.folded = text
            return
        # Characters that fold to exactly one character (θ, ², Cyrillic о, '—', '\r') are translated in place, which
        # keeps every position; only entities and characters that fold to zero or several need spans of their own.
        table: dict[str, str] = dict(_ASCII_LINE_BREAKS)
        irregular = []
        for char in {c for c in set(text) if not c.isascii() or c in _ASCII_INVISIBLE}:
            folded = fold_char(char)
            if len(folded) != 1:
                irregular.append(char)
            elif folded != char:
                table[char] = folded
        translated = text
        for char, folded in table.items():  # a few str.replace calls beat str.translate on non-ASCII text
            translated = translated.replace(char, folded)
        if "&" not in text and not irregular:
            self.folded = translated
            return
        alternatives = [_ENTITY] + (["[" + re.escape("".join(sorted(irregular))) + "]+"] if irregular else [])
        parts: list[str] = []
        length = 0  # of the folded text so far
        position = 0
        for match in re.finditer("|".join(alternatives), translated):
            piece = match.group()
            if match.group(2) is not None:
                entity = "&" + match.group(2)
                decoded = html.unescape(entity)
                pieces = [piece if decoded == entity else "".join(map(fold_char, decoded))]
            else:  # a run of characters that fold to zero or several characters each
                pieces = [fold_char(c) for c in piece]
            parts.append(translated[position : match.start()])  # one for one, continuing the last segment
            length += match.start() - position
            origin = match.start()
            for folded in pieces:
                end = match.end() if len(pieces) == 1 else origin + 1
                if len(folded) == 1 and end == origin + 1:
                    self._segment(length, origin, None)
                elif folded:
                    self._segment(length, origin, end)
                parts.append(folded)
                length += len(folded)
                origin = end
            self._segment(length, match.end(), None)
            position = match.end()
        parts.append(translated[position:])
        self.folded = "".join(parts)

    @functools.cached_property
    def lowered(self) -> str:
        """`folded` in lower case, position for position: the neutralisers' patterns are lower-case and run on
        it (re.IGNORECASE is several times slower on non-ASCII text)."""
        lowered = self.folded.lower()
        if len(lowered) != len(self.folded):  # a character whose lower case is longer: keep it as it is
            lowered = "".join(c.lower() if len(c.lower()) == 1 else c for c in self.folded)
        return lowered

    def _segment(self, folded_start: int, original_start: int, original_end: int | None) -> None:
        if original_end is None:  # one-for-one from here: merge with the segment before when it continues it
            last = len(self._folded_starts) - 1
            if self._original_ends[last] is None and (
                self._original_starts[last] - self._folded_starts[last] == original_start - folded_start
            ):
                return
        if self._folded_starts[-1] == folded_start:  # replaces an empty segment at the same place
            self._folded_starts.pop(), self._original_starts.pop(), self._original_ends.pop()
        self._folded_starts.append(folded_start)
        self._original_starts.append(original_start)
        self._original_ends.append(original_end)

    def _origin(self, index: int) -> tuple[int, int]:
        segment = bisect.bisect_right(self._folded_starts, index) - 1
        start, end = self._original_starts[segment], self._original_ends[segment]
        if end is None:
            start += index - self._folded_starts[segment]
            return start, start + 1
        return start, end

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The span of the original text that folded[start:end] came from (whole characters/entities)."""
        if start >= end:
            position = self.line_start(start)
            return position, position
        return self._origin(start)[0], self._origin(end - 1)[1]

    def line_start(self, start: int) -> int:
        """Where in the original text the folded line starting at `start` begins (just after its line break)."""
        return 0 if start == 0 else self._origin(start - 1)[1]


# ------------------------------------------------------------------------------------------- neutralisers
Edit = tuple[int, int, str]  # replace original[start:end] by the string (start == end: an insertion)
Rule = Callable[[Folded], list[Edit]]

# The patterns below are matched on `Folded.lowered`, so they are written in lower case, without re.IGNORECASE.
_ROLE_TOKENS = re.compile(
    r"<\|[^<>|\n]{1,64}\|>|<\|[a-z_]{2,40}|\[/?inst\]|<</?sys>>|</?(?:s|bos|eos|start_of_turn|end_of_turn)>"
)
_TO_ROUND = str.maketrans("<>[]", "()()")
_SECTION = re.compile(r"section(?=[ \t\n\-:.]*[0-9])")  # not after a letter or digit: checked in _sections

_UNDERLINE = r"[ \t]*(?:=+|-+|(?:[-*_=~][ \t]*){3,})[ \t]*$"  # setext underline, thematic break, '-------'
_NUMBER_PREFIX = r"(?:[0-9]+(?:[ \t*_]*[.):])?[ \t*_]*)?"
_PPM_LINES = re.compile(
    r"^(?:[ \t]*#"  # any Markdown header
    r"|[ \t#*_]*(?:problem\s+statement|partial\s+rollout|rubric|instructions|student\s+solution)\b"  # prompt headers
    rf"|{_UNDERLINE}"
    rf"|[ \t#*_]*{_NUMBER_PREFIX}(?:criterion|evidence|reason|verdict)[ \t*_]*:"  # Section 1 fields
    r"|[ \t#*_]*[0-9]+(?:[ \t*_]*[.):])?[ \t*_]*(?:yes|no)\b"  # a grade line, even with prose after it
    rf"|(?:{GRADE_LINE.pattern})$"  # exactly what parse_point_grades reads as a grade line
    r")",
    re.MULTILINE,
)
_PAPO_NAMES = r"(?:instructions?|scoring\s+rubric|problem|reference\s+solution|student\s+solution|evaluation)"
_PAPO_LINES = re.compile(
    rf"^(?:[ \t#*_]*#+[ \t]*{_PAPO_NAMES}\b"  # '## Evaluation'
    rf"|[ \t#*_]*{_PAPO_NAMES}[ \t*_:]*$"  # a bare 'Evaluation' line (a header once underlined or bold)
    rf"|{_UNDERLINE}"
    r"|[ \t#*_]*(?:final[ \t]+)?(?:analysis|score)[ \t*_]*:"  # the answer format the parser reads
    r")",
    re.MULTILINE,
)
_HEADERS = re.compile(r"^[ \t]*#", re.MULTILINE)


@functools.cache
def _ascii_variants(letter: str) -> str:
    """`letter` and the ASCII characters TR39 lists as confusable with it, lower-cased (`l`: `l`, `1`, `i`, `|`)."""
    conf = _confusables()
    found = {letter}
    for other in map(chr, range(0x21, 0x7F)):
        if letter in conf.get(other, ()) or letter.upper() in conf.get(other, ()) or other in conf.get(letter, ()):
            found.add(other.lower())
    return "".join(sorted(found))


def _lookalike_name(name: str) -> str:
    """A tag-name pattern in which each plain letter also matches its ASCII look-alikes (`</ro11out>`, `</roIIout>`)."""
    pieces = []
    for piece in re.findall(r"\\.|.", name):
        variants = _ascii_variants(piece) if len(piece) == 1 and piece.isascii() and piece.isalpha() else piece
        pieces.append(f"[{re.escape(variants)}]" if len(piece) == 1 and len(variants) > 1 else piece)
    return "".join(pieces)


def tag_rule(names: Iterable[str]) -> Rule:
    """`<name ...>`, `</name>`, `</name` (no `>`), `<\\/name>` → `(name ...)`, `(/name)`."""
    names = tuple(names)

    @functools.cache
    def pattern() -> re.Pattern[str]:  # built on first use: the confusables data loads lazily
        alternatives = "|".join(map(_lookalike_name, names))
        return re.compile(rf"<[ \t\n]*(\\*/)?[ \t\n]*({alternatives})(?![a-z0-9_])(?:([^<>\n]{{0,200}})>)?")

    def edits(folded: Folded) -> list[Edit]:
        return [
            (*folded.span(m.start(), m.end()), f"({'/' if m.group(1) else ''}{m.group(2)}{m.group(3) or ''})")
            for m in pattern().finditer(folded.lowered)
        ]

    return edits


# `<|im_end|>` written with bars TR39 reads as `l` (letter-like `ǀ`, digit-like `𝟏`): only when both are non-ASCII.
_LETTER_BAR_TOKEN = re.compile(r"<[l1i][a-z_]{2,40}[l1i]>")


def _role_tokens(folded: Folded) -> list[Edit]:
    edits = [(*folded.span(m.start(), m.end()), m.group().translate(_TO_ROUND)) for m in _ROLE_TOKENS.finditer(folded.lowered)]
    for m in _LETTER_BAR_TOKEN.finditer(folded.lowered):
        bars = [folded.text[slice(*folded.span(i, i + 1))] for i in (m.start() + 1, m.end() - 2)]
        if not any(bar.isascii() for bar in bars):
            edits.append((*folded.span(m.start(), m.end()), f"(|{m.group()[2:-2]}|)"))
    return edits


def _sections(folded: Folded) -> list[Edit]:
    text = folded.lowered
    return [
        (*folded.span(m.start(), m.end()), "§")
        for m in _SECTION.finditer(text)
        if m.start() == 0 or not (text[m.start() - 1].isascii() and text[m.start() - 1].isalnum())
    ]


def line_rule(pattern: re.Pattern[str]) -> Rule:
    """Quote ('> ') every line whose folded form `pattern` matches at its start."""

    def edits(folded: Folded) -> list[Edit]:
        starts = {m.start() for m in pattern.finditer(folded.lowered)}
        return [(folded.line_start(s), folded.line_start(s), "> ") for s in sorted(starts)]

    return edits


def strip_hidden(text: str) -> str:
    """`text` without its hidden characters (`is_hidden`): what prints as nothing cannot smuggle anything in."""
    hidden = [c for c in set(text) if (not c.isascii() or c in _ASCII_INVISIBLE) and is_hidden(c)]
    if not hidden:
        return text
    return text.translate(dict.fromkeys(map(ord, hidden)))


def neutralize(text: str, rules: Iterable[Rule], max_passes: int = 4) -> str:
    """Apply `rules` until nothing in the folded text matches any of them (a replacement can, rarely, bring two
    pieces together into a new match). Each pass is linear in `len(text)`."""
    rules = list(rules)
    text = strip_hidden(text)
    for _ in range(max_passes):
        folded = Folded(text)
        edits = sorted({edit for rule in rules for edit in rule(folded)}, key=lambda e: (e[0], e[1] > e[0]))
        if not edits:
            return text
        pieces, position = [], 0
        for start, end, replacement in edits:
            if start < position:  # overlaps the edit before: the next pass sees what is left
                continue
            pieces += [text[position:start], replacement]
            position = end
        pieces.append(text[position:])
        text = "".join(pieces)
    return text


# ------------------------------------------------------------------------------------------ per prompt
_ROLLOUT_RULES = (tag_rule(["rollout"]), _role_tokens, _sections, line_rule(_PPM_LINES))
_PAPO_RULES = (_role_tokens, line_rule(_PAPO_LINES))
_PROCESS_RULES = (tag_rule([r"part_\d+", r"analysis_\d+", "conclusion"]), _role_tokens, line_rule(_HEADERS))


# Headers that name a section of the rubric-generation, obsoletion-graph or process-reward prompts (other headers,
# such as a GSM8K reference's '#### 72', are the dataset's own and stay as written).
_SECTION_HEADERS = re.compile(
    r"^[ \t#*_]*#[ \t#*_]*(?:example[ \t]+)?(?:problem|reference|solution|rubric|instructions?|task|output|"
    r"obsoletion|evaluation|student)\b",
    re.MULTILINE,
)
_DATASET_RULES = (tag_rule(["rollout", "rubric", "makes_obsolete_graph", "rule", r"part_\d+", r"analysis_\d+", "conclusion"]),
                  _role_tokens, _sections)


def escape_dataset_text(text: str, rules: str = "ppm") -> str:
    """Dataset text (problem, reference solution, rubric point) for a prompt: a poisoned row could otherwise close
    the prompt's tags or plant its structure. The rules of the prompt's untrusted slot (`rules`: 'ppm', 'papo' or
    'process') plus every tag the judge prompts and parsers use (`<rollout>`, `<rubric>`, `<makes_obsolete_graph>`,
    `<part_i>`, `<conclusion>`, ...), chat-template tokens and 'Section N'."""
    line_rules = {"ppm": (line_rule(_PPM_LINES),), "papo": (line_rule(_PAPO_LINES),),
                  "process": (line_rule(_SECTION_HEADERS),)}
    if rules not in line_rules:
        raise ValueError(f"unknown escaping rules {rules!r}; accepted: {sorted(line_rules)}")
    return neutralize(text, _DATASET_RULES + line_rules[rules])


def escape_rollout(text: str) -> str:
    """Untrusted rollout text for the PPM grading (and standard rubric) prompt."""
    return neutralize(text, _ROLLOUT_RULES)


def escape_papo_solution(text: str) -> str:
    """Untrusted student solution for the PAPO A.3 rubric prompt: its '## ...' headers and 'Score:' lines."""
    return neutralize(text, _PAPO_RULES)


def escape_process_chunk(text: str) -> str:
    """Untrusted chunk for the process-reward prompt: its <part_i>, <analysis_i>, <conclusion> tags."""
    return neutralize(text, _PROCESS_RULES)
