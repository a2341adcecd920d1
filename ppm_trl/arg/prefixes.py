"""Where a guidance level cuts a reference: boundary snapping (App. E.2), the length budget, and the plan of every
level at once (`plan_reference_prefixes`: surprisal cut, then snap). Pure Python + torch, no tokenizer: the trainer
passes the reference text and its tokens' character offsets.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .surprisal import check_alpha, suffix_surprisals, surprisal_prefix_length

_DISPLAY_OPENERS = ("$$", "\\[")


def _math_scan(text: str) -> tuple[list[bool], list[bool]]:
    """Per character position p in 0..len(text): whether text[:p] has every math delimiter and brace closed (and p
    is not inside a lexeme such as `\\(` or `\\frac`), and whether p is right after a display formula that closed.

    Delimiters: `$…$`, `$$…$$`, `\\(…\\)`, `\\[…\\]`, `\\begin{e}…\\end{e}`, `{…}`; `\\$`, `\\{`, `\\}` are literals.
    A closer whose opener is deeper in the stack closes the openers above it; a closer with no opener is ignored.
    """
    size = len(text)
    closed = [False] * (size + 1)
    display_end = [False] * (size + 1)
    closed[0] = True
    stack: list[str] = []

    def close(opener: str) -> bool:
        """Pop down to `opener`; True when the stack became empty and the opener was a display formula."""
        if opener not in stack:
            return False
        while stack.pop() != opener:
            pass
        return not stack and (opener in _DISPLAY_OPENERS or opener.startswith("env:"))

    i = 0
    while i < size:
        ch = text[i]
        ended_display = False
        step = 1
        if ch == "\\":
            nxt = text[i + 1] if i + 1 < size else ""
            if nxt in ("(", "["):
                stack.append("\\" + nxt)
                step = 2
            elif nxt in (")", "]"):
                ended_display = close("\\(" if nxt == ")" else "\\[")
                step = 2
            elif text.startswith(("begin{", "end{"), i + 1) and text.find("}", i) != -1:
                brace = text.index("{", i)
                stop = text.index("}", brace)
                env = "env:" + text[brace + 1 : stop]
                if text.startswith("begin{", i + 1):
                    stack.append(env)
                else:
                    ended_display = close(env)
                step = stop + 1 - i
            elif nxt.isalpha():
                step = 1
                while i + step < size and text[i + step].isalpha():
                    step += 1
            elif nxt:
                step = 2  # `\$`, `\{`, `\}`, `\\`, `\,` …: one escaped character
        elif ch == "$":
            if text.startswith("$$", i) and (not stack or stack[-1] != "$"):
                if stack and stack[-1] == "$$":
                    ended_display = close("$$")
                else:
                    stack.append("$$")
                step = 2
            elif stack and stack[-1] == "$":
                stack.pop()
            else:
                stack.append("$")
        elif ch == "{":
            stack.append("{")
        elif ch == "}":
            close("{")
        i += step
        closed[i] = not stack
        display_end[i] = ended_display
    return closed, display_end


def boundary_char_positions(text: str, answer_marker: str | None = "\\boxed") -> list[int]:
    """Character positions p (0 < p < len(text)) where the prefix text[:p] may end (App. E.2), ascending.

    p is valid when all math delimiters are closed at p, and text[:p], ignoring trailing spaces/tabs, ends with a
    newline, with a sentence end `.`/`!`/`?` followed by whitespace, or with the end of a display formula
    (`$$…$$`, `\\[…\\]`, `\\begin{…}…\\end{…}`); and the suffix text[p:] is "nontrivial" and keeps the whole
    final answer: it holds the last occurrence of `answer_marker` (default `\\boxed`) with a non-space character
    before it. A suffix that is the boxed answer alone is trivial — "containing the final boxed answer" already rules
    out an empty one, so "nontrivial" asks for more: some of the solution left for the policy to write before the
    answer (a continuation of the answer alone only restates what the prefix holds). With `answer_marker=None` the
    suffix only has to contain a non-space character. A reference without the marker is a ValueError (the paper drops
    references that do not end in the boxed gold answer, App. E.1).
    """
    if answer_marker is None:
        limit = len(text.rstrip()) - 1
    else:
        limit = text.rfind(answer_marker)
        if limit < 0:
            raise ValueError(
                f"reference has no final answer marker {answer_marker!r}: the prefix must leave the final answer "
                "in the suffix (App. E.2); give the reference a boxed answer or pass answer_marker=None"
            )
        limit = len(text[:limit].rstrip()) - 1  # the last non-space character before the marker stays in the suffix
    closed, display_end = _math_scan(text)
    positions = []
    for p in range(1, min(limit, len(text) - 1) + 1):
        if not closed[p]:
            continue
        q = p
        while q > 0 and text[q - 1] in " \t":
            q -= 1
        if q == 0:
            continue
        last = text[q - 1]
        sentence_end = last in ".!?" and (q < p or text[p].isspace())
        if last == "\n" or sentence_end or display_end[q]:
            positions.append(p)
    return positions


def _as_offsets(token_offsets, text_length: int) -> list[tuple[int, int]]:
    offsets = [(int(start), int(end)) for start, end in torch.as_tensor(token_offsets).reshape(-1, 2).tolist()]
    for index, (start, end) in enumerate(offsets):
        if not 0 <= start <= end <= text_length:
            raise ValueError(
                f"token_offsets[{index}] = ({start}, {end}) is not a span of the {text_length}-character reference; "
                "pass the offset_mapping of the reference tokens only (no special tokens)"
            )
        if index and start < offsets[index - 1][0]:
            raise ValueError(f"token_offsets[{index}] starts before token {index - 1}: offsets must be in text order")
    return offsets


def valid_prefix_cuts(
    text: str,
    token_offsets,
    answer_marker: str | None = "\\boxed",
    max_prefix_tokens: int | None = None,
) -> list[int]:
    """Token cuts t (prefix = the first t reference tokens, 1 ≤ t < n) that end on a boundary, ascending.

    `token_offsets` is the tokenizer's (n, 2) character `offset_mapping` of the reference tokens. Cut t is at
    character offsets[t][0] (the start of the first suffix token) and is a token boundary only when token t−1 ends
    by then (byte-level tokens that split one character overlap and are never cut apart). `max_prefix_tokens` (see
    `prefix_budget`) drops longer cuts.
    """
    if max_prefix_tokens is not None and max_prefix_tokens < 0:
        raise ValueError(f"max_prefix_tokens must be >= 0 (see prefix_budget), got {max_prefix_tokens}")
    offsets = _as_offsets(token_offsets, len(text))
    allowed = set(boundary_char_positions(text, answer_marker))
    cap = len(offsets) - 1 if max_prefix_tokens is None else min(int(max_prefix_tokens), len(offsets) - 1)
    return [t for t in range(1, cap + 1) if offsets[t - 1][1] <= offsets[t][0] and offsets[t][0] in allowed]


def snap_prefix_length(prefix_len: int, valid_cuts: Sequence[int]) -> int:
    """App. E.2: 0 stays 0; else the first valid cut at or after `prefix_len`, else the latest earlier one, else 0."""
    if prefix_len < 0:
        raise ValueError(f"prefix_len must be >= 0, got {prefix_len}")
    if prefix_len == 0 or not valid_cuts:
        return 0
    index = bisect.bisect_left(valid_cuts, prefix_len)
    return int(valid_cuts[index]) if index < len(valid_cuts) else int(valid_cuts[-1])


def prefix_budget(max_completion_length: int, min_continuation_tokens: int) -> int:
    """Longest reference prefix (tokens) allowed: max_completion_length − min_continuation_tokens.

    The prefix counts toward the trajectory budget (App. E.2), so each continuation is generated with
    max_new_tokens = max_completion_length − prefix_len ≥ min_continuation_tokens and prefix + continuation never
    exceeds max_completion_length. Pass the result as `max_prefix_tokens`: a cut past it snaps back to the latest
    valid boundary within it (or the empty prefix).
    """
    if max_completion_length < 1:
        raise ValueError(f"max_completion_length must be >= 1, got {max_completion_length}")
    if not 1 <= min_continuation_tokens <= max_completion_length:
        raise ValueError(
            f"min_continuation_tokens must lie in [1, max_completion_length={max_completion_length}], "
            f"got {min_continuation_tokens}"
        )
    return max_completion_length - min_continuation_tokens


@dataclass(frozen=True)
class GuidedPrefix:
    """Where a guidance level cuts one reference: the prefix length and the surprisal fraction S_t/S_0 left."""

    level: float
    prefix_len: int
    surprisal_ratio: float

    @property
    def collapsed(self) -> bool:
        """A level α < 1 whose snapped prefix is empty (no valid cut within the budget): t_x(α) = 0 (App. E.2)."""
        return self.level < 1.0 and self.prefix_len == 0


EMPTY_PREFIX = GuidedPrefix(level=1.0, prefix_len=0, surprisal_ratio=1.0)  # α = 1: free generation, S_0/S_0 = 1


def plan_reference_prefixes(
    token_logprobs,
    levels: Sequence[float],
    text: str,
    token_offsets,
    answer_marker: str | None = "\\boxed",
    max_prefix_tokens: int | None = None,
) -> dict[float, GuidedPrefix]:
    """Prefix of one reference for each level (§4.1 + App. E.2): surprisal cut, then boundary snap.

    `token_logprobs` (n,) are the reference tokens' log-probs under the current model, `token_offsets` their (n, 2)
    character offsets in `text`. `surprisal_ratio` = S_t/S_0 at the snapped cut, the factor of the feedback W (eq. 7).
    Needs 0 < S_0 < ∞ when a level is below 1 (see `batched_surprisal_prefix_lengths`).
    """
    logprobs = torch.as_tensor(token_logprobs, dtype=torch.float64)
    if logprobs.dim() != 1:
        raise ValueError(f"token_logprobs must be 1-D, got shape {tuple(logprobs.shape)}")
    if torch.as_tensor(token_offsets).reshape(-1, 2).shape[0] != logprobs.shape[0]:
        raise ValueError(
            f"token_offsets has {torch.as_tensor(token_offsets).reshape(-1, 2).shape[0]} rows but token_logprobs "
            f"has {logprobs.shape[0]} tokens; both must describe the same reference tokens"
        )
    surprisal = suffix_surprisals(logprobs)
    cuts = None
    plan = {}
    for level in levels:
        level = check_alpha(level)
        raw = surprisal_prefix_length(logprobs, level)
        if raw > 0 and cuts is None:
            cuts = valid_prefix_cuts(text, token_offsets, answer_marker, max_prefix_tokens)
        prefix_len = snap_prefix_length(raw, cuts or [])
        ratio = 1.0 if prefix_len == 0 else float(surprisal[prefix_len] / surprisal[0])
        plan[level] = GuidedPrefix(level=level, prefix_len=prefix_len, surprisal_ratio=ratio)
    return plan
