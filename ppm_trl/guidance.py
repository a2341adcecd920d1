"""The pure core of Adaptive Reference Guidance (ARG, "Balancing Reference Guidance and Free Generation", §3–4).

For an all-failure group the trainer scores the reference once under the current model and hands this module:

* per-token log-probs of the reference → suffix surprisals S_t = −Σ_{j≥t} log π(r_j | x, r_<j) (eq. 4) and, per
  guidance level α, the latest prefix length t with S_t ≥ α·S_0 (§4.1);
* the reference text and per-token character offsets → the token cuts that are valid sentence/formula boundaries
  (App. E.2), to which that length is snapped; `plan_reference_prefixes` does both for every level at once;
* continuation outcomes → selector feedback W (eq. 7), the `PrefixSelector` update (eqs. 11, 12, 18) and the
  acceptance rule of §4.3 (`accept_candidates`, `choose_replacement_rows`);
* references that can guide (App. E.1: `reference_problem`, `check_references`, `screen_reference`);
* one step of Algorithm 1 as data (`GuidanceMode`, `scan_failures`, `GroupPlan`, `resolve_group`, `GroupOutcome`,
  `selector_feedback`, `guidance_metrics`): the trainer (`ppm_trl/trainers/arg.py`) only scores, generates, verifies,
  gathers and replaces rows. Also importable as `ppm_trl.arg` (DESIGN.md's Public API path; see ppm_trl/__init__.py).

torch + stdlib only: no TRL, no tokenizer, no model. Surprisals are computed in float64.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import torch

from .text import last_boxed

logger = logging.getLogger(__name__)

# A log-prob above this is not a log-prob; at or below it, a positive value is rounding noise and is read as 0
# (so S_t never increases with t and 0 ≤ S_t/S_0 ≤ 1 holds exactly, Lemma B.1).
_LOGPROB_TOLERANCE = 1e-3


# ----------------------------------------------------------------------------------------------------------------
# Surprisal → prefix length (§3.3, §4.1)
# ----------------------------------------------------------------------------------------------------------------


def _check_alpha(alpha: float) -> float:
    alpha = float(alpha)
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"guidance level alpha must lie in (0, 1], got {alpha}")
    return alpha


def _as_logprob_matrix(token_logprobs, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) float64 log-probs with padding zeroed, and the (B, L) bool mask (right padding only)."""
    logprobs = torch.as_tensor(token_logprobs).detach().to("cpu", torch.float64)
    if logprobs.dim() != 2:
        raise ValueError(f"token_logprobs must be 2-D (B, L) here, got shape {tuple(logprobs.shape)}")
    if mask is None:
        mask = torch.ones_like(logprobs, dtype=torch.bool)
    mask = torch.as_tensor(mask).detach().to("cpu").bool()
    if mask.shape != logprobs.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match token_logprobs {tuple(logprobs.shape)}")
    if mask.shape[1] > 1 and bool((mask[:, 1:] & ~mask[:, :-1]).any()):
        row = int((mask[:, 1:] & ~mask[:, :-1]).any(dim=1).nonzero()[0])
        raise ValueError(f"mask row {row} is not right-padded (True tokens then False padding)")
    real = torch.where(mask, logprobs, torch.zeros_like(logprobs))
    if bool(torch.isnan(real).any()):
        row = int(torch.isnan(real).any(dim=1).nonzero()[0])
        raise ValueError(f"token_logprobs row {row} contains NaN")
    if bool((real > _LOGPROB_TOLERANCE).any()):
        row = int((real > _LOGPROB_TOLERANCE).any(dim=1).nonzero()[0])
        raise ValueError(f"token_logprobs row {row} has a positive value > {_LOGPROB_TOLERANCE}: not a log-prob")
    return real.clamp(max=0.0), mask


def suffix_surprisals(token_logprobs, mask=None) -> torch.Tensor:
    """S_t = −Σ_{j≥t} log π(r_j | …) for t = 0..L (eq. 4); S_0 is the whole reference, S_L = 0.

    `token_logprobs` (L,) → (L + 1,); (B, L) with a right-padding `mask` → (B, L + 1), where S_t = 0 for t at or
    past a row's length. A reverse cumulative sum, float64.
    """
    squeeze = torch.as_tensor(token_logprobs).dim() == 1
    if squeeze:
        token_logprobs = torch.as_tensor(token_logprobs).unsqueeze(0)
        mask = None if mask is None else torch.as_tensor(mask).unsqueeze(0)
    logprobs, _ = _as_logprob_matrix(token_logprobs, mask)
    suffix = torch.flip(torch.cumsum(torch.flip(-logprobs, dims=[1]), dim=1), dims=[1])
    surprisal = torch.cat([suffix, torch.zeros_like(suffix[:, :1])], dim=1)
    return surprisal[0] if squeeze else surprisal


def batched_surprisal_prefix_lengths(token_logprobs, mask, alpha) -> torch.Tensor:
    """Latest prefix length t in [0, n_b) with S_t ≥ α·S_0 for every row b (§4.1, before boundary snapping).

    `token_logprobs` (B, L) and right-padding `mask` (B, L) (None = no padding); `alpha` a float or a (B,) tensor.
    α = 1 gives 0 (the empty prefix). A row with α < 1 needs 0 < S_0 < ∞ (Alg. 1, line 6: a reference whose
    surprisal is 0 or infinite gets no continuations); otherwise ValueError. Returns a (B,) long tensor.
    """
    logprobs, mask = _as_logprob_matrix(token_logprobs, mask)
    batch, length = logprobs.shape
    alphas = torch.as_tensor(alpha, dtype=torch.float64).detach().cpu().reshape(-1)
    if alphas.numel() not in (1, batch):
        raise ValueError(f"alpha must be a float or one level per row ({batch}), got {alphas.numel()} values")
    alphas = alphas.expand(batch).clone()
    for value in alphas.tolist():
        _check_alpha(value)
    surprisal = suffix_surprisals(logprobs, mask)
    total = surprisal[:, 0]
    guided = alphas < 1.0
    unusable = guided & ~(torch.isfinite(total) & (total > 0))
    if bool(unusable.any()):
        row = int(unusable.nonzero()[0])
        raise ValueError(
            f"row {row}: reference surprisal S_0 = {float(total[row])} is not in (0, inf), so no prefix level "
            "alpha < 1 is defined (paper Alg. 1 line 6: such a reference gets no continuations, only fallback)"
        )
    # Guided rows have S_0 > 0 and S_n = 0, so the latest qualifying t is < n; t = 0 always qualifies.
    if length == 0:
        return torch.zeros(batch, dtype=torch.long)
    qualifies = (surprisal[:, :length] >= alphas[:, None] * total[:, None]) & mask
    positions = torch.arange(length).expand(batch, length)
    latest = torch.where(qualifies, positions, torch.zeros_like(positions)).amax(dim=1)
    return torch.where(guided, latest, torch.zeros_like(latest))


def surprisal_prefix_length(token_logprobs, alpha) -> int:
    """Latest t with S_t ≥ α·S_0 for one reference (1-D tensor or list of log-probs); α = 1 → 0 (empty prefix)."""
    row = torch.as_tensor(token_logprobs, dtype=torch.float64)
    if row.dim() != 1:
        raise ValueError(f"token_logprobs must be 1-D for one reference, got shape {tuple(row.shape)}")
    return int(batched_surprisal_prefix_lengths(row.unsqueeze(0), None, alpha)[0])


# ----------------------------------------------------------------------------------------------------------------
# Boundary snapping (App. E.2) and the length budget
# ----------------------------------------------------------------------------------------------------------------

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
    (`$$…$$`, `\\[…\\]`, `\\begin{…}…\\end{…}`); and the suffix text[p:] keeps the whole final answer: p is at or
    before the last occurrence of `answer_marker` (default `\\boxed`). With `answer_marker=None` the suffix only
    has to contain a non-space character. A reference without the marker is a ValueError (the paper drops
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
        level = _check_alpha(level)
        raw = surprisal_prefix_length(logprobs, level)
        if raw > 0 and cuts is None:
            cuts = valid_prefix_cuts(text, token_offsets, answer_marker, max_prefix_tokens)
        prefix_len = snap_prefix_length(raw, cuts or [])
        ratio = 1.0 if prefix_len == 0 else float(surprisal[prefix_len] / surprisal[0])
        plan[level] = GuidedPrefix(level=level, prefix_len=prefix_len, surprisal_ratio=ratio)
    return plan


# ----------------------------------------------------------------------------------------------------------------
# Prefix selector (eqs. 11, 12, 18; Theorem 2)
# ----------------------------------------------------------------------------------------------------------------


class PrefixSelector:
    r"""Distribution over guidance levels shared across questions, learned by REINFORCE (§3.3, §4.2).

    ρ(α) = (1 − ε)·softmax(φ)_α + ε/|A| (eq. 11). After a batch of continuations with levels α_j and feedback W_j,
    φ ← φ + η·Σ_j (W_j − b)·∇_φ log ρ(α_j) (eq. 12) with b fixed during the batch, then
    b ← (1 − β)·b + β·mean_j W_j (eq. 18). With q = softmax(φ) the exact score of the ε-mixture is
    ∇_φ log ρ(a) = (1 − ε)·q_a·(e_a − q) / ρ(a); Theorem 2: E[(W − b)·∇ log ρ(α)] = ∇_φ J(φ), J = Σ_α ρ(α)·E[W | α].
    Sampling uses the selector's own seeded generator, saved in `state_dict` so a resumed run samples identically.
    """

    def __init__(
        self,
        levels: Sequence[float] = (1.0, 0.5, 0.25),
        epsilon: float = 0.2,
        lr: float = 0.3,
        baseline_rate: float = 0.1,
        seed: int = 0,
    ):
        levels = [float(level) for level in levels]
        if not levels:
            raise ValueError("levels must be a non-empty sequence of guidance levels in (0, 1]")
        for level in levels:
            _check_alpha(level)
        if len(set(levels)) != len(levels):
            raise ValueError(f"levels must be unique, got {levels}")
        if not 0.0 <= epsilon < 1.0:
            raise ValueError(f"epsilon (uniform exploration mass) must lie in [0, 1), got {epsilon}")
        if not (lr > 0 and math.isfinite(lr)):
            raise ValueError(f"lr (selector step size eta) must be a positive finite number, got {lr}")
        if not 0.0 < baseline_rate <= 1.0:
            raise ValueError(f"baseline_rate (beta) must lie in (0, 1], got {baseline_rate}")
        self.levels = tuple(levels)
        self.epsilon = float(epsilon)
        self.lr = float(lr)
        self.baseline_rate = float(baseline_rate)
        self.seed = int(seed)
        self._logits = torch.zeros(len(levels), dtype=torch.float64)
        self._baseline = 0.0
        self.num_updates = 0
        self._generator = torch.Generator().manual_seed(self.seed)

    @property
    def logits(self) -> torch.Tensor:
        return self._logits.clone()

    @property
    def baseline(self) -> float:
        return self._baseline

    def probs(self) -> torch.Tensor:
        """ρ over `levels` (eq. 11), float64; every entry ≥ ε/|A|."""
        return (1.0 - self.epsilon) * torch.softmax(self._logits, dim=0) + self.epsilon / len(self.levels)

    def sample(self, k: int) -> list[float]:
        """k i.i.d. levels from ρ (Alg. 1 line 7), drawn with the selector's own generator."""
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        if k == 0:
            return []
        indices = torch.multinomial(self.probs(), k, replacement=True, generator=self._generator)
        return [self.levels[i] for i in indices.tolist()]

    def level_indices(self, levels) -> torch.Tensor:
        """Positions of `levels` in `self.levels` (exact match, else math.isclose); unknown level → ValueError."""
        lookup = {level: i for i, level in enumerate(self.levels)}
        indices = []
        for value in torch.as_tensor(levels, dtype=torch.float64).reshape(-1).tolist():
            index = lookup.get(value)
            if index is None:
                index = next((i for i, lv in enumerate(self.levels) if math.isclose(lv, value, rel_tol=1e-9)), None)
            if index is None:
                raise ValueError(f"level {value} is not one of the selector's levels {list(self.levels)}")
            indices.append(index)
        return torch.tensor(indices, dtype=torch.long)

    def grad_log_prob(self, levels) -> torch.Tensor:
        """(k, |A|): row j = ∇_φ log ρ(α_j) = (1 − ε)·q_{α_j}·(e_{α_j} − q) / ρ(α_j)."""
        return self._score(self.level_indices(levels))

    def _score(self, indices: torch.Tensor) -> torch.Tensor:
        q = torch.softmax(self._logits, dim=0)
        n = len(self.levels)
        if self.epsilon == 0.0:
            coef = torch.ones(len(indices), dtype=torch.float64)
        else:  # (1−ε)q_a / ((1−ε)q_a + ε/n), written so that q_a = 0 gives 0, not 0/0
            q_a = q[indices]
            coef = (1.0 - self.epsilon) * q_a / ((1.0 - self.epsilon) * q_a + self.epsilon / n)
        one_hot = torch.nn.functional.one_hot(indices, n).to(torch.float64)
        return coef[:, None] * (one_hot - q[None, :])

    def update(self, levels, feedback) -> None:
        """One selector step from a batch of continuations (eq. 12), then the baseline (eq. 18).

        `feedback` W_j ∈ [0, 1] (eq. 7, Lemma B.1), one per level. An empty batch changes nothing (App. B.4).
        """
        weights = torch.as_tensor(feedback, dtype=torch.float64).reshape(-1)
        indices = self.level_indices(levels)
        if len(indices) != len(weights):
            raise ValueError(f"got {len(indices)} levels but {len(weights)} feedback values; need one per continuation")
        if len(weights) == 0:
            return
        if not bool(torch.isfinite(weights).all()) or bool(((weights < 0) | (weights > 1)).any()):
            raise ValueError(f"feedback must be finite values in [0, 1] (eq. 7), got {weights.tolist()}")
        direction = ((weights - self._baseline)[:, None] * self._score(indices)).sum(dim=0)
        self._logits = self._logits + self.lr * direction
        self._baseline = (1.0 - self.baseline_rate) * self._baseline + self.baseline_rate * float(weights.mean())
        self.num_updates += 1

    def state_dict(self) -> dict:
        """JSON-serialisable: levels, logits, baseline, update count and the sampler's generator state (ints)."""
        return {
            "levels": list(self.levels),
            "logits": self._logits.tolist(),
            "baseline": self._baseline,
            "num_updates": self.num_updates,
            "generator_state": self._generator.get_state().tolist(),
        }

    def load_state_dict(self, state: dict) -> None:
        missing = {"levels", "logits", "baseline", "generator_state"} - set(state)
        if missing:
            raise ValueError(f"selector state is missing {sorted(missing)}")
        if [float(level) for level in state["levels"]] != list(self.levels):
            raise ValueError(f"selector state has levels {state['levels']}, this selector has {list(self.levels)}")
        logits = torch.tensor(state["logits"], dtype=torch.float64)
        baseline = float(state["baseline"])
        if logits.shape != (len(self.levels),) or not bool(torch.isfinite(logits).all()):
            raise ValueError(f"selector state logits must be {len(self.levels)} finite numbers, got {state['logits']}")
        if not 0.0 <= baseline <= 1.0:
            raise ValueError(f"selector state baseline must lie in [0, 1], got {baseline}")
        self._generator.set_state(torch.tensor(state["generator_state"], dtype=torch.uint8))
        self._logits = logits
        self._baseline = baseline
        self.num_updates = int(state.get("num_updates", 0))


def mean_feedback_per_level(levels, feedback, all_levels: Sequence[float]) -> dict[float, float]:
    """Mean W per level for logging; NaN for a level with no continuation in this batch."""
    sums = {float(level): [0.0, 0] for level in all_levels}
    for level, weight in zip(levels, feedback, strict=True):
        if float(level) not in sums:
            raise ValueError(f"level {level} is not one of {list(all_levels)}")
        sums[float(level)][0] += float(weight)
        sums[float(level)][1] += 1
    return {level: (total / count if count else math.nan) for level, (total, count) in sums.items()}


# ----------------------------------------------------------------------------------------------------------------
# Feedback (eq. 7) and acceptance (§4.3)
# ----------------------------------------------------------------------------------------------------------------


def continuation_feedback(
    correct: bool, same_as_reference: bool, prefix_surprisal_ratio: float, surprisal_weighting: bool = True
) -> float:
    """W = 1{correct and ≠ reference}·S_t/S_0 (eq. 7), S_t/S_0 ∈ [0, 1] at the (snapped) cut t of this
    continuation: the fraction of the reference surprisal the model produced itself. Weighting off (§5.3 ablation):
    the indicator alone."""
    ratio = float(prefix_surprisal_ratio)
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"prefix_surprisal_ratio S_t/S_0 must lie in [0, 1], got {ratio}")
    success = bool(correct) and not bool(same_as_reference)
    if not success:
        return 0.0
    return ratio if surprisal_weighting else 1.0


@dataclass(frozen=True)
class Candidate:
    """One continuation's candidate trajectory h_t ⊕ Z for `accept_candidates`."""

    correct: bool
    same_as_reference: bool
    prefix_len: int


def accept_candidates(candidates, max_total: int = 4, max_empty: int = 4, max_guided: int = 1) -> list[int]:
    """Indices of the candidates to insert, in acceptance order (§4.3, Table 3); [] = fall back to the reference.

    Eligible: correct and not an exact copy of the reference. First the eligible empty-prefix candidates
    (prefix_len == 0) in index order, up to min(max_empty, max_total); then, while fewer than max_total, at most
    max_guided eligible non-empty-prefix candidates, shortest prefix first (ties: lowest index).
    """
    if max_total < 1 or max_empty < 0 or max_guided < 0:
        raise ValueError(
            f"need max_total >= 1, max_empty >= 0, max_guided >= 0; got {max_total}, {max_empty}, {max_guided}"
        )
    empty, guided = [], []
    for index, candidate in enumerate(candidates):
        prefix_len = candidate.prefix_len
        if isinstance(prefix_len, bool) or int(prefix_len) != prefix_len or prefix_len < 0:
            raise ValueError(f"candidate {index}: prefix_len must be an int >= 0, got {prefix_len!r}")
        if not candidate.correct or candidate.same_as_reference:
            continue
        (empty if prefix_len == 0 else guided).append(index)
    accepted = empty[: min(max_empty, max_total)]
    room = min(max_guided, max_total - len(accepted))
    guided.sort(key=lambda index: (candidates[index].prefix_len, index))
    return accepted + guided[:room]


def choose_replacement_rows(
    num_failed_rows: int, num_inserts: int, generator: torch.Generator | None = None
) -> list[int]:
    """Distinct positions in [0, num_failed_rows), uniformly at random: inserted trajectory i replaces row [i]."""
    if num_failed_rows < 0 or not 0 <= num_inserts <= num_failed_rows:
        raise ValueError(
            f"need 0 <= num_inserts <= num_failed_rows, got num_inserts={num_inserts}, num_failed_rows={num_failed_rows}"
        )
    return torch.randperm(num_failed_rows, generator=generator)[:num_inserts].tolist()



# ----------------------------------------------------------------------------------------------------------------
# References (App. E.1)
# ----------------------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------------------
# One step of Algorithm 1 as data: mode, plans, outcomes, selector feedback and metrics
# ----------------------------------------------------------------------------------------------------------------


class GuidanceMode(str, Enum):
    """What an all-failure group gets (`ARGConfig.arg_mode`; the ablations are §5.3's). Chosen once per trainer."""

    ARG = "arg"  # selector levels → surprisal prefixes → continuations; reference fallback; the selector learns
    REFERENCE_INSERTION = "reference_insertion"  # no continuations: the reference replaces one failure
    RESAMPLING = "resampling"  # K continuations from the empty prefix, accepted under the same caps; no fallback

    @property
    def adaptive(self) -> bool:
        """Levels drawn from the selector, prefixes cut by the reference surprisal, the selector trained on W."""
        return self is GuidanceMode.ARG

    @property
    def continues(self) -> bool:
        """Generates continuations (every process then joins the generation and verification collectives)."""
        return self is not GuidanceMode.REFERENCE_INSERTION

    @property
    def falls_back_to_reference(self) -> bool:
        """A group with no accepted continuation gets the reference (§4.3)."""
        return self is not GuidanceMode.RESAMPLING

    def fixed_plan(self, num_continuations: int) -> GroupPlan:
        """The plan of a valid group in a mode without surprisal: K empty prefixes (resampling) or none."""
        if self.adaptive:
            raise ValueError("arg mode plans each group from its reference surprisal (plan_guided_group)")
        if self.continues:
            return GroupPlan(GroupStatus.GUIDED, (EMPTY_PREFIX,) * num_continuations)
        return GroupPlan(GroupStatus.FALLBACK_ONLY)

    def logged_levels(self, selector_levels: Sequence[float]) -> list[float]:
        """Levels with per-level metrics: the selector's, and α = 1 for resampling (its only level)."""
        levels = [float(level) for level in selector_levels]
        if self is GuidanceMode.RESAMPLING and 1.0 not in levels:
            levels.append(1.0)
        return levels


class GroupStatus(str, Enum):
    """What planning decided for one all-failure group."""

    GUIDED = "guided"  # continuations planned
    FALLBACK_ONLY = "fallback_only"  # reference insertion: no continuations
    DEGENERATE_SURPRISAL = "degenerate_surprisal"  # S_0 not in (0, ∞): no continuations (Alg. 1 line 6)
    INVALID_REFERENCE = "invalid_reference"  # skipped (arg_skip_invalid_references), counted


@dataclass(frozen=True)
class GroupPlan:
    """One all-failure group's continuations: the prefix (level, length, S_t/S_0) of each, in sampling order."""

    status: GroupStatus
    prefixes: tuple[GuidedPrefix, ...] = ()


def all_failure_groups(verdict, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(failed, unscorable) per group of `group_size` consecutive rows of the verifier's rewards (NaN = unscorable).

    failed: every row scored and ≤ 0 (the groups ARG guides); unscorable: some row unscorable and none correct (not
    guided, counted). Both (num_groups,) bool.
    """
    verdict = torch.as_tensor(verdict).reshape(-1)
    if group_size < 1 or verdict.numel() % group_size:
        raise ValueError(f"{verdict.numel()} rewards do not split into groups of {group_size}")
    scored = ~torch.isnan(verdict)
    failed = (scored & (verdict <= 0)).view(-1, group_size).all(dim=1)
    unscorable = (~scored).view(-1, group_size).any(dim=1) & ~(verdict > 0).view(-1, group_size).any(dim=1)
    return failed, unscorable


@dataclass(frozen=True)
class FailedGroup:
    """An all-failure group held by this process."""

    order: int  # position among the step's all-failure groups, in global order (the same on every process)
    first_row: int  # this process's index of the group's first row


@dataclass(frozen=True)
class FailureScan:
    """The step's all-failure groups as one process sees them (Alg. 1 line 4)."""

    num_failed: int  # all-failure groups of the step, on every process
    num_unscorable: int  # groups with an unscorable row and no correct one: not guided, counted
    max_local: int  # the most all-failure groups one process holds: pads every process's surprisal forward
    groups: tuple[FailedGroup, ...]  # this process's, in order


def scan_failures(verdict, group_size: int, process_index: int = 0, num_processes: int = 1) -> FailureScan:
    """`all_failure_groups` of the gathered verifier rewards (process p holds the p-th equal share of the groups)."""
    failed, unscorable = all_failure_groups(verdict, group_size)
    if not 0 <= process_index < num_processes or len(failed) % num_processes:
        raise ValueError(f"{len(failed)} groups do not split evenly over {num_processes} processes")
    per_process = len(failed) // num_processes
    first = process_index * per_process
    groups = tuple(
        FailedGroup(order, (group - first) * group_size)
        for order, group in enumerate(failed.nonzero().flatten().tolist())
        if first <= group < first + per_process
    )
    max_local = int(failed.view(num_processes, per_process).sum(dim=1).max()) if len(failed) else 0
    return FailureScan(int(failed.sum()), int(unscorable.sum()), max_local, groups)


def screen_reference(reference, answer_marker: str, skip_invalid: bool) -> GroupPlan | None:
    """None when a failed group's `reference` can guide; else the INVALID_REFERENCE plan with `skip_invalid`
    (skipped, counted) or a ValueError that names the problem (rows met during training, e.g. iterable datasets)."""
    problem = reference_problem(reference, answer_marker)
    if problem is None:
        return None
    if not skip_invalid:
        raise ValueError(f"ARG: reference {reference!r:.80} of a training row is invalid: {problem}")
    return GroupPlan(GroupStatus.INVALID_REFERENCE)


def plan_guided_group(
    token_logprobs,
    sampled_levels: Sequence[float],
    levels: Sequence[float],
    text: str,
    token_offsets,
    answer_marker: str | None = "\\boxed",
    max_prefix_tokens: int | None = None,
) -> GroupPlan:
    """ARG's plan for one group (§4.1, App. E.2): one continuation per sampled level, at that level's snapped prefix of
    the reference (`plan_reference_prefixes` over all `levels`); none when S_0 ∉ (0, ∞) (Alg. 1 line 6).

    A level whose valid cuts all lie past the budget continues from the empty prefix: that is t_x(α), so the
    continuation is credited to the sampled α with W at the adjusted prefix (S_0/S_0 = 1; eq. 12, App. H.1) and only
    counted as collapsed (`GuidedPrefix.collapsed`).
    """
    total = -float(torch.as_tensor(token_logprobs, dtype=torch.float64).sum())
    if not 0.0 < total < math.inf:
        return GroupPlan(GroupStatus.DEGENERATE_SURPRISAL)
    plan = plan_reference_prefixes(token_logprobs, levels, text, token_offsets, answer_marker, max_prefix_tokens)
    return GroupPlan(GroupStatus.GUIDED, tuple(plan[float(level)] for level in sampled_levels))


@dataclass(frozen=True)
class VerifiedContinuation:
    """A generated continuation h_t ⊕ Z of a planned prefix, after verification."""

    prefix: GuidedPrefix
    correct: bool  # the verifier's verdict
    copies_reference: bool  # the completion is the reference itself (not a success, eq. 4's d_t)
    trainable: bool = True  # False: truncated while truncated rows are masked out of the loss (cannot fill a slot)


@dataclass(frozen=True)
class ContinuationOutcome:
    """One continuation as the selector and the metrics see it."""

    level: float
    collapsed: bool
    correct: bool
    copies_reference: bool
    accepted: bool
    feedback: float  # W (eq. 7)

    @property
    def success(self) -> bool:
        return self.correct and not self.copies_reference


@dataclass(frozen=True)
class GroupOutcome:
    """What guidance did for one all-failure group; gathered from every process once per step."""

    order: int
    status: GroupStatus
    continuations: tuple[ContinuationOutcome, ...] = ()
    accepted: tuple[int, ...] = ()  # indices of the inserted continuations, in acceptance order
    fallback: bool = False  # the reference was inserted
    fallback_too_long: bool = False  # the reference was due but longer than the budget (inserting it cut would
    # lose its boxed answer): skipped, counted

    @property
    def inserted(self) -> int:
        return len(self.accepted) + int(self.fallback)


def resolve_group(
    order: int,
    plan: GroupPlan,
    continuations: Sequence[VerifiedContinuation],
    *,
    max_accepted: int,
    max_empty: int,
    max_guided: int,
    falls_back: bool,
    reference_fits: bool,
    surprisal_weighting: bool = True,
) -> GroupOutcome:
    """§4.3 for one group: accept candidates (`accept_candidates`), else fall back to the reference when the mode does
    and it fits the budget; each continuation's feedback W (eq. 7, `continuation_feedback`)."""
    accepted = accept_candidates(
        [Candidate(c.correct and c.trainable, c.copies_reference, c.prefix.prefix_len) for c in continuations],
        max_accepted, max_empty, max_guided,
    )
    records = tuple(
        ContinuationOutcome(
            level=c.prefix.level, collapsed=c.prefix.collapsed, correct=c.correct,
            copies_reference=c.copies_reference, accepted=index in accepted,
            feedback=continuation_feedback(c.correct, c.copies_reference, c.prefix.surprisal_ratio,
                                           surprisal_weighting),
        )
        for index, c in enumerate(continuations)
    )
    due = falls_back and not accepted
    return GroupOutcome(order, plan.status, records, tuple(accepted), fallback=due and reference_fits,
                        fallback_too_long=due and not reference_fits)


def selector_feedback(outcomes: Sequence[GroupOutcome]) -> tuple[list[float], list[float]]:
    """(levels, W) of every continuation of the step, in global group order: the batch of one selector update.

    Every continuation enters with its sampled level α_j and W at its adjusted prefix (§4.2: "every continuation
    provides the selector feedback"; App. E.2, H.1), collapsed ones included: dropping them would bias eq. 12
    against levels that often collapse.
    """
    records = [c for outcome in sorted(outcomes, key=lambda o: o.order) for c in outcome.continuations]
    return [c.level for c in records], [c.feedback for c in records]


def guidance_metrics(
    outcomes: Sequence[GroupOutcome], scan: FailureScan, mode: GuidanceMode, selector: PrefixSelector
) -> dict[str, float]:
    """The `arg/...` metrics of one step from every process's outcomes (after the selector update).

    A rate without a denominator (no all-failure group, no continuation at a level) is absent, not 0.
    """
    num_failed, levels = scan.num_failed, mode.logged_levels(selector.levels)
    outcomes = sorted(outcomes, key=lambda o: o.order)
    records = [c for outcome in outcomes for c in outcome.continuations]
    accepted_groups = sum(any(c.accepted for c in outcome.continuations) for outcome in outcomes)
    statuses = Counter(outcome.status for outcome in outcomes)
    metrics = {
        "arg/all_failure_groups": num_failed,
        "arg/unscorable_groups": scan.num_unscorable,
        "arg/guided_groups": statuses[GroupStatus.GUIDED],
        "arg/groups_with_accepted": accepted_groups,
    }
    if num_failed:  # App. G.2's rescue rate: groups that accept a candidate (reference fallback excluded)
        metrics["arg/rescue_rate"] = accepted_groups / num_failed
    metrics.update({
        "arg/fallback_groups": sum(outcome.fallback for outcome in outcomes),
        "arg/fallback_too_long": sum(outcome.fallback_too_long for outcome in outcomes),
        "arg/degenerate_surprisal_groups": statuses[GroupStatus.DEGENERATE_SURPRISAL],
        "arg/invalid_reference_groups": statuses[GroupStatus.INVALID_REFERENCE],
        "arg/inserted_rows": sum(outcome.inserted for outcome in outcomes),
        "arg/continuations": len(records),
        "arg/collapsed_levels": sum(c.collapsed for c in records),
    })
    mean_feedback = mean_feedback_per_level([c.level for c in records], [c.feedback for c in records], levels)
    for level in levels:
        picked = [c for c in records if c.level == level]
        if picked:  # correct_rate counts byte copies of the reference; success_rate (eq. 4's d_t) does not
            name = f"alpha_{level:g}"
            for metric, value in (("correct_rate", lambda c: c.correct), ("copy_rate", lambda c: c.copies_reference),
                                  ("success_rate", lambda c: c.success), ("acceptance_rate", lambda c: c.accepted)):
                metrics[f"arg/{metric}/{name}"] = sum(value(c) for c in picked) / len(picked)
            metrics[f"arg/mean_feedback/{name}"] = mean_feedback[level]
    for level, prob in zip(levels, selector.probs().tolist()):
        metrics[f"arg/selector_prob/alpha_{level:g}"] = prob
    metrics["arg/selector_baseline"] = selector.baseline
    return metrics
