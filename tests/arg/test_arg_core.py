"""ARG's pure core (ppm_trl/arg/: surprisal, prefixes, selector, acceptance) against hand-computed values and the
paper's equations (§3–4, App. B, E.2)."""

from __future__ import annotations

import json
import math
import random
import re
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ppm_trl.arg.acceptance import Candidate, accept_candidates, choose_replacement_rows, continuation_feedback
from ppm_trl.arg.prefixes import (
    boundary_char_positions,
    plan_reference_prefixes,
    prefix_budget,
    snap_prefix_length,
    valid_prefix_cuts,
)
from ppm_trl.arg.selector import PrefixSelector, mean_feedback_per_level
from ppm_trl.arg.surprisal import batched_surprisal_prefix_lengths, suffix_surprisals, surprisal_prefix_length

# ---------------------------------------------------------------------------------------------------------------
# Surprisal → prefix length
# ---------------------------------------------------------------------------------------------------------------

# S_t = -sum_{j>=t} lp_j by hand: S = [4, 3, 1, 0.5, 0].
pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

HAND_LOGPROBS = [-1.0, -2.0, -0.5, -0.5]


def test_suffix_surprisals_by_hand():
    assert suffix_surprisals(torch.tensor(HAND_LOGPROBS)).tolist() == [4.0, 3.0, 1.0, 0.5, 0.0]
    padded = torch.tensor([HAND_LOGPROBS, [-2.0, -1.0, 7.0, 7.0]])  # 7.0 is padding: must be ignored
    mask = torch.tensor([[True] * 4, [True, True, False, False]])
    assert suffix_surprisals(padded, mask).tolist() == [[4.0, 3.0, 1.0, 0.5, 0.0], [3.0, 1.0, 0.0, 0.0, 0.0]]


@pytest.mark.parametrize(
    "alpha, expected",
    [
        (1.0, 0),  # the empty prefix by definition
        (0.5, 1),  # S_t >= 2: t in {0, 1}
        (0.25, 2),  # S_t >= 1: t in {0, 1, 2}
        (0.1, 3),  # S_t >= 0.4: t in {0, 1, 2, 3}
    ],
)
def test_surprisal_prefix_length_by_hand(alpha, expected):
    assert surprisal_prefix_length(torch.tensor(HAND_LOGPROBS), alpha) == expected
    assert surprisal_prefix_length(HAND_LOGPROBS, alpha) == expected  # a plain list works too


def test_threshold_is_inclusive_and_alpha_one_is_empty_even_with_free_first_tokens():
    # S = [4, 3, 2, 1, 0]; S_2 = 2 = 0.5 * S_0 exactly, so t = 2 qualifies (">=").
    assert surprisal_prefix_length([-1.0, -1.0, -1.0, -1.0], 0.5) == 2
    # The first two tokens cost nothing, so S_0 = S_1 = S_2; alpha = 1 must still give the empty prefix.
    assert surprisal_prefix_length([0.0, 0.0, -1.0, -1.0], 1.0) == 0
    assert surprisal_prefix_length([0.0, 0.0, -1.0, -1.0], 0.99) == 2


def _brute_force_prefix_length(logprobs: list[float], alpha: float) -> int:
    if alpha == 1.0:
        return 0
    total = -sum(logprobs)
    return max(t for t in range(len(logprobs)) if -sum(logprobs[t:]) >= alpha * total)


def test_batched_equals_unbatched_and_brute_force():
    rng = random.Random(0)
    rows = [[-rng.randint(1, 16) / 8 for _ in range(rng.randint(1, 12))] for _ in range(20)]  # dyadic: exact sums
    alphas = [rng.choice([1.0, 0.5, 0.25, 0.75]) for _ in rows]
    width = max(map(len, rows))
    padded = torch.tensor([row + [0.0] * (width - len(row)) for row in rows])
    mask = torch.tensor([[j < len(row) for j in range(width)] for row in rows])
    batched = batched_surprisal_prefix_lengths(padded, mask, torch.tensor(alphas))
    assert batched.dtype == torch.long
    for b, (row, alpha) in enumerate(zip(rows, alphas)):
        assert int(batched[b]) == surprisal_prefix_length(row, alpha) == _brute_force_prefix_length(row, alpha)
    # A single float alpha broadcasts to every row.
    same = batched_surprisal_prefix_lengths(padded, mask, 0.5)
    assert same.tolist() == [_brute_force_prefix_length(row, 0.5) for row in rows]


def test_surprisal_rejects_bad_input():
    with pytest.raises(ValueError, match="alpha"):
        surprisal_prefix_length(HAND_LOGPROBS, 0.0)
    with pytest.raises(ValueError, match="alpha"):
        surprisal_prefix_length(HAND_LOGPROBS, 1.5)
    with pytest.raises(ValueError, match="NaN"):
        surprisal_prefix_length([-1.0, float("nan")], 0.5)
    with pytest.raises(ValueError, match="not a log-prob"):
        surprisal_prefix_length([-1.0, 0.5], 0.5)
    with pytest.raises(ValueError, match=r"S_0 = 0.0 is not in \(0, inf\)"):
        surprisal_prefix_length([0.0, 0.0], 0.5)
    with pytest.raises(ValueError, match="S_0 = inf"):
        surprisal_prefix_length([-1.0, float("-inf")], 0.5)
    with pytest.raises(ValueError, match="right-padded"):
        batched_surprisal_prefix_lengths(torch.zeros(1, 3), torch.tensor([[True, False, True]]), 1.0)
    with pytest.raises(ValueError, match="row 1"):
        batched_surprisal_prefix_lengths(torch.tensor([[-1.0], [0.0]]), None, 0.5)
    # Rounding noise above 0 is read as 0; alpha = 1 needs no usable S_0.
    assert suffix_surprisals([-1.0, 1e-6]).tolist() == [1.0, 0.0, 0.0]
    assert surprisal_prefix_length([0.0, 0.0], 1.0) == 0


# ---------------------------------------------------------------------------------------------------------------
# Boundaries (App. E.2)
# ---------------------------------------------------------------------------------------------------------------


def _after(text: str, anchor: str) -> int:
    return text.index(anchor) + len(anchor)


def test_boundaries_inline_math_decimals_and_sentence_ends():
    text = "Let $a. b$ be given. Then 3.14 is pi!\nSo $\\boxed{7}$"
    given_end = _after(text, "given.")
    pi_end = _after(text, "pi!")
    # After "given." (followed by a space) and after that space; after "pi!" (followed by a newline) and after the
    # newline. Not after "a." (inside $...$), not inside "3.14", not after "So " (no sentence end).
    assert boundary_char_positions(text) == [given_end, given_end + 1, pi_end, pi_end + 1]


def test_boundaries_display_math_and_boxed_answer():
    text = "First.\n\\[\nx = 1. y = 2\n\\]\nHence \\boxed{3}."
    display_end = _after(text, "\\]")
    # Newlines and ". " inside \[...\] are not boundaries; the end of the display formula is. Nothing at or
    # after "\boxed" (the final "." is after the answer).
    assert boundary_char_positions(text) == [6, 7, display_end, display_end + 1]


def test_boundaries_dollar_display_environments_escapes_and_braces():
    text = "$$a.\nb$$ Next. \\begin{align}\nx &= 1.\n\\end{align}\nSo \\$5. Then \\textbf{A. B} ok.\n\\boxed{5}"
    expected = []
    for anchor in ["b$$", "Next.", "\\end{align}", "\\$5."]:
        expected += [_after(text, anchor), _after(text, anchor) + 1]
    # "\$" is a literal dollar, so "5." ends a sentence; "A. B" is inside an open brace; "$$...$$" and the align
    # environment hide their "." and newlines. After "ok." and after "ok.\n" the suffix would be the boxed answer
    # alone: not a nontrivial suffix (App. E.2), so the last boundary leaves "Then ... ok." to the policy.
    assert boundary_char_positions(text) == expected


def test_a_suffix_of_the_boxed_answer_alone_is_not_a_boundary():
    # App. E.2: a valid boundary "leaves a nontrivial suffix containing the final boxed answer"; the answer alone (or
    # with blanks before it) is trivial: the policy would write nothing of the solution.
    text = "2+3=5\n4+4=8\n\\boxed{5, 8}"
    assert boundary_char_positions(text) == [_after(text, "2+3=5\n")]
    assert boundary_char_positions("One.  \n \\boxed{1}") == []
    # Something of the solution before the answer keeps the cut, even on the answer's own line.
    text = "x = 7.\nSo the answer is \\boxed{7}."
    assert boundary_char_positions(text) == [_after(text, "x = 7."), _after(text, "x = 7.\n")]
    # The whole reference as a prefix of one line, the answer alone after it: no cut, so every level falls back to the
    # empty prefix (snap_prefix_length with no cuts).
    assert boundary_char_positions("7\n\\boxed{7}") == []


def test_boundaries_need_the_answer_marker_unless_disabled():
    with pytest.raises(ValueError, match="boxed"):
        boundary_char_positions("One. Two. The answer is 3.")
    # Without a marker the suffix only has to be non-blank: the position after the last "." is excluded.
    text = "One. Two. Three."
    assert boundary_char_positions(text, answer_marker=None) == [4, 5, 9, 10]
    assert boundary_char_positions("Answer: <ans>3</ans>. Done", answer_marker="<ans>") == []


def test_snap_prefix_length_forward_then_backward_then_empty():
    cuts = [3, 7, 12]
    assert snap_prefix_length(0, cuts) == 0  # the empty prefix is never moved
    assert snap_prefix_length(1, cuts) == 3  # forward to the first boundary at or after t
    assert snap_prefix_length(7, cuts) == 7  # already a boundary
    assert snap_prefix_length(8, cuts) == 12
    assert snap_prefix_length(13, cuts) == 12  # none after: the latest earlier one
    assert snap_prefix_length(5, []) == 0  # none at all: empty prefix
    with pytest.raises(ValueError):
        snap_prefix_length(-1, cuts)


_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|[A-Za-z0-9]+|\s|.")


def _tokenise(text: str) -> list[tuple[int, int]]:
    """Hand-rolled tokenizer for tests: commands, words, single spaces/punctuation, with character offsets."""
    return [match.span() for match in _TOKEN.finditer(text)]


def test_token_cuts_by_hand():
    text = "One. Two. \\boxed{3}"
    offsets = _tokenise(text)  # One . ␣ Two . ␣ \boxed { 3 }
    assert [text[a:b] for a, b in offsets] == ["One", ".", " ", "Two", ".", " ", "\\boxed", "{", "3", "}"]
    # Cut t starts the suffix at token t: after "One." (t=2), after "One. " (3). After "Two." (5) and "Two. " (6) the
    # suffix would be the boxed answer alone (not nontrivial, App. E.2).
    assert valid_prefix_cuts(text, offsets) == [2, 3]
    assert valid_prefix_cuts(text, offsets, max_prefix_tokens=2) == [2]


def test_token_cuts_never_split_a_character_and_accept_offset_gaps():
    text = "Hi.\n\u00e9 \\boxed{1}"
    # Byte-level tokens: "é" is two tokens with the same (4, 5) span. Char 4 (after the newline) is a boundary,
    # but only the cut before the first byte (t = 4) is a token boundary; t = 5 would split "é".
    offsets = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (4, 5)] + [(5 + i, 6 + i) for i in range(10)]
    assert offsets[-1][1] == len(text)
    assert valid_prefix_cuts(text, offsets) == [3, 4]
    # Tokenizers that trim the leading space leave a gap: "One" (0,3) "." (3,4) "Two" (5,8) ...; cut 2 starts at
    # char 5, after "One. ", a sentence end.
    text = "One. Two \\boxed{2}"
    offsets = [(0, 3), (3, 4), (5, 8), (9, 15), (15, 16), (16, 17), (17, 18)]
    assert valid_prefix_cuts(text, offsets) == [2]
    with pytest.raises(ValueError, match="offset"):
        valid_prefix_cuts(text, [(0, 3), (3, 99)])


RICH_REFERENCE = (
    "We solve it. Let $f(x) = x^2. $ Then:\n"
    "\\[ f(2) = 4. \\quad g = \\{1, 2\\} \\]\n"
    "Also $$a = 1.\nb = 2.$$ and \\(c. d\\) hold! Next, \\begin{align}\nu &= 1. \\\\\nv &= 2.\n\\end{align}\n"
    "Costs \\$3.50 today. So {a. b} is fine.\n"
    "Therefore the answer is $\\boxed{\\frac{1}{2}}$. Check: 0.5."
)


def _delimiters_closed(prefix: str) -> bool:
    """Independent necessary check: every delimiter count balances in the prefix."""
    text = prefix.replace("\\\\", "").replace("\\$", "").replace("\\{", "").replace("\\}", "")
    return (
        text.count("$") % 2 == 0
        and text.count("\\[") == text.count("\\]")
        and text.count("\\(") == text.count("\\)")
        and text.count("\\begin{") == text.count("\\end{")
        and text.count("{") == text.count("}")
    )


def test_every_snapped_prefix_keeps_formulas_whole_and_the_answer_in_the_suffix():
    text = RICH_REFERENCE
    offsets = _tokenise(text)
    cuts = valid_prefix_cuts(text, offsets)
    assert len(cuts) >= 8  # the reference has many boundaries outside math
    for t in range(len(offsets)):
        snapped = snap_prefix_length(t, cuts)
        if t == 0:
            assert snapped == 0
            continue
        assert snapped > 0
        cut_char = offsets[snapped][0]
        prefix, suffix = text[:cut_char], text[cut_char:]
        assert _delimiters_closed(prefix), prefix
        assert "\\boxed{\\frac{1}{2}}" in suffix
        # Forward snapping: no valid cut lies in [t, snapped) (and backward only when none lies after t).
        assert not any(t <= c < snapped for c in cuts)
        assert snapped >= t or not any(c >= t for c in cuts)


def test_prefix_budget():
    assert prefix_budget(100, 30) == 70
    assert prefix_budget(100, 100) == 0
    with pytest.raises(ValueError, match="min_continuation_tokens"):
        prefix_budget(100, 0)
    with pytest.raises(ValueError, match="min_continuation_tokens"):
        prefix_budget(100, 101)


def test_plan_reference_prefixes_by_hand():
    text = "One. Two. So \\boxed{3}"
    offsets = _tokenise(text)  # One . ␣ Two . ␣ So ␣ \boxed { 3 }: cuts [2, 3, 5, 6] ("So" is left to the policy)
    logprobs = [-2.0, -0.5, -0.5, -1.0, -1.0, -0.25, -0.25, -0.5, -1.0, -1.0, -1.0, -1.0]
    # S = [10, 8, 7.5, 7, 6, 5, 4.75, 4.5, 4, 3, 2, 1, 0]
    plan = plan_reference_prefixes(logprobs, [1.0, 0.8, 0.5, 0.25], text, offsets)
    assert (plan[1.0].prefix_len, plan[1.0].surprisal_ratio) == (0, 1.0)
    assert (plan[0.8].prefix_len, plan[0.8].surprisal_ratio) == (2, 0.75)  # t = 1 → forward to 2, S_2/S_0
    assert (plan[0.5].prefix_len, plan[0.5].surprisal_ratio) == (5, 0.5)  # t = 5 is a boundary
    assert (plan[0.25].prefix_len, plan[0.25].surprisal_ratio) == (6, 0.475)  # t = 9 → back to 6
    capped = plan_reference_prefixes(logprobs, [0.5], text, offsets, max_prefix_tokens=4)
    assert (capped[0.5].prefix_len, capped[0.5].surprisal_ratio) == (3, 0.7)
    # No boundary at all → empty prefix.
    bare = "abc \\boxed{3}"
    none = plan_reference_prefixes([-1.0] * 6, [0.5], bare, _tokenise(bare))
    assert (none[0.5].prefix_len, none[0.5].surprisal_ratio) == (0, 1.0)
    with pytest.raises(ValueError, match="same reference tokens"):
        plan_reference_prefixes(logprobs[:-1], [0.5], text, offsets)


# ---------------------------------------------------------------------------------------------------------------
# Prefix selector
# ---------------------------------------------------------------------------------------------------------------


def _selector_with(logits, baseline, **kwargs) -> PrefixSelector:
    selector = PrefixSelector(**kwargs)
    state = selector.state_dict()
    state.update(logits=list(logits), baseline=baseline)
    selector.load_state_dict(state)
    return selector


def test_selector_starts_uniform_and_validates_arguments():
    selector = PrefixSelector()
    assert selector.levels == (1.0, 0.5, 0.25)
    assert selector.logits.tolist() == [0.0, 0.0, 0.0] and selector.baseline == 0.0
    assert torch.allclose(selector.probs(), torch.full((3,), 1 / 3, dtype=torch.float64))
    for kwargs in [
        {"levels": ()},
        {"levels": (1.0, 0.0)},
        {"levels": (1.0, 1.2)},
        {"levels": (1.0, 0.5, 0.5)},
        {"epsilon": 1.0},
        {"epsilon": -0.1},
        {"lr": 0.0},
        {"baseline_rate": 0.0},
        {"baseline_rate": 1.5},
    ]:
        with pytest.raises(ValueError):
            PrefixSelector(**kwargs)


def test_selector_probs_are_the_epsilon_mixture_by_hand():
    # phi = [ln 2, 0, 0] → softmax q = [1/2, 1/4, 1/4]; rho = 0.8 q + 0.2/3 = [7/15, 4/15, 4/15].
    selector = _selector_with([math.log(2.0), 0.0, 0.0], 0.1)
    assert torch.allclose(selector.probs(), torch.tensor([7 / 15, 4 / 15, 4 / 15], dtype=torch.float64))


def test_selector_update_equals_the_hand_derived_gradient_of_log_rho():
    # d log rho(a) / d phi = (1 - eps) q_a (e_a - q) / rho(a). With q = [1/2, 1/4, 1/4], rho = [7/15, 4/15, 4/15]:
    #   a = level 1.0:  0.8 * 1/2 / (7/15) * (1/2, -1/4, -1/4) = (6/7)  * (1/2, -1/4, -1/4) = (3/7, -3/14, -3/14)
    #   a = level 0.5:  0.8 * 1/4 / (4/15) * (-1/2, 3/4, -1/4) = (3/4)  * (-1/2, 3/4, -1/4) = (-3/8, 9/16, -3/16)
    # (The plain softmax score e_a - q would give (1/2, -1/4, -1/4) and (-1/2, 3/4, -1/4).)
    score_full = [Fraction(3, 7), Fraction(-3, 14), Fraction(-3, 14)]
    score_half = [Fraction(-3, 8), Fraction(9, 16), Fraction(-3, 16)]
    selector = _selector_with([math.log(2.0), 0.0, 0.0], 0.1)
    expected_scores = torch.tensor([[float(x) for x in score_full], [float(x) for x in score_half]])
    assert torch.allclose(selector.grad_log_prob([1.0, 0.5]).float(), expected_scores, atol=1e-6)
    # Update: phi += 0.3 * [(0 - 0.1) * score_full + (0.6 - 0.1) * score_half]; b = 0.9 * 0.1 + 0.1 * 0.3 = 0.12.
    delta = [Fraction(3, 10) * (Fraction(-1, 10) * f + Fraction(1, 2) * h) for f, h in zip(score_full, score_half)]
    expected_logits = [math.log(2.0) + float(delta[0]), float(delta[1]), float(delta[2])]
    selector.update([1.0, 0.5], [0.0, 0.6])
    assert selector.logits.tolist() == pytest.approx(expected_logits, abs=1e-12)
    assert selector.baseline == pytest.approx(0.12, abs=1e-15)
    assert selector.num_updates == 1


def test_grad_log_prob_matches_autograd():
    selector = _selector_with([0.7, -1.3, 0.2], 0.0, epsilon=0.35)
    phi = torch.tensor([0.7, -1.3, 0.2], dtype=torch.float64, requires_grad=True)
    for index, level in enumerate(selector.levels):
        rho = 0.65 * torch.softmax(phi, 0) + 0.35 / 3
        (grad,) = torch.autograd.grad(torch.log(rho[index]), phi)
        assert torch.allclose(selector.grad_log_prob([level])[0], grad, atol=1e-12)


def test_update_is_unbiased_for_the_objective_gradient_theorem_2():
    """E[(W - b) grad log rho(alpha)] = grad J, J(phi) = sum_a rho(a) E[W | a] (eq. 10), by Monte Carlo."""
    success = {1.0: 0.05, 0.5: 0.5, 0.25: 0.9}  # d_alpha
    ratio = {1.0: 1.0, 0.5: 0.6, 0.25: 0.3}  # S_t / S_0 at that level
    mu = torch.tensor([success[a] * ratio[a] for a in (1.0, 0.5, 0.25)], dtype=torch.float64)
    phi0 = [0.3, -0.2, 0.5]
    epsilon, baseline, n = 0.5, 0.6, 200_000

    def objective(phi: torch.Tensor) -> float:
        rho = (1 - epsilon) * torch.softmax(phi, 0) + epsilon / 3
        return float((rho * mu).sum())

    finite_diff = torch.zeros(3, dtype=torch.float64)
    for k in range(3):
        step = torch.zeros(3, dtype=torch.float64)
        step[k] = 1e-5
        base = torch.tensor(phi0, dtype=torch.float64)
        finite_diff[k] = (objective(base + step) - objective(base - step)) / 2e-5

    selector = _selector_with(phi0, baseline, epsilon=epsilon, lr=1.0, seed=1)
    levels = selector.sample(n)
    rng = torch.Generator().manual_seed(2)
    hits = torch.rand(n, generator=rng, dtype=torch.float64) < torch.tensor([success[a] for a in levels])
    feedback = hits.double() * torch.tensor([ratio[a] for a in levels], dtype=torch.float64)
    selector.update(levels, feedback)
    estimate = (selector.logits - torch.tensor(phi0, dtype=torch.float64)) / n
    # grad J is about (-0.026, 0.011, 0.015); the estimate's standard error is about 3e-4 per component.
    assert torch.allclose(estimate, finite_diff, atol=1.5e-3), (estimate, finite_diff)
    # The test has power: the plain softmax score would be biased here by far more than the tolerance.
    q = torch.softmax(torch.tensor(phi0, dtype=torch.float64), 0)
    rho = (1 - epsilon) * q + epsilon / 3
    plain = sum(rho[a] * (mu[a] - baseline) * (torch.eye(3, dtype=torch.float64)[a] - q) for a in range(3))
    assert (plain - finite_diff).abs().max() > 0.02


@settings(max_examples=40, deadline=None)
@given(
    epsilon=st.floats(0.01, 0.9),
    lr=st.floats(1.0, 1e4),
    batches=st.lists(
        st.lists(st.tuples(st.sampled_from([1.0, 0.5, 0.25]), st.floats(0.0, 1.0)), min_size=1, max_size=8),
        min_size=1,
        max_size=15,
    ),
)
def test_probabilities_never_fall_below_the_exploration_floor(epsilon, lr, batches):
    selector = PrefixSelector(epsilon=epsilon, lr=lr)
    floor = epsilon / 3
    for batch in batches:
        levels, feedback = zip(*batch)
        selector.update(list(levels), list(feedback))
        probs = selector.probs()
        assert bool(torch.isfinite(selector.logits).all())
        assert float(probs.min()) >= floor * (1 - 1e-12)
        assert float(probs.sum()) == pytest.approx(1.0, abs=1e-12)
        assert 0.0 <= selector.baseline <= 1.0


def test_state_dict_round_trip_gives_identical_future_samples_and_updates():
    selector = PrefixSelector(seed=7)
    selector.update(selector.sample(8), [0.0, 0.5, 1.0, 0.0, 0.25, 0.0, 0.0, 0.75])
    selector.sample(5)  # advance the generator past its seed
    state = json.loads(json.dumps(selector.state_dict()))  # must survive JSON (checkpoint files)
    resumed = PrefixSelector(seed=123)  # a different seed: the state must override it
    resumed.load_state_dict(state)
    for _ in range(3):
        levels = selector.sample(8)
        assert resumed.sample(8) == levels
        feedback = [0.5 if level == 0.5 else 0.0 for level in levels]
        selector.update(levels, feedback)
        resumed.update(levels, feedback)
        assert resumed.logits.tolist() == selector.logits.tolist()
        assert resumed.baseline == selector.baseline
    with pytest.raises(ValueError, match="levels"):
        PrefixSelector(levels=(1.0, 0.5)).load_state_dict(state)


def test_sampling_is_seeded_and_follows_rho():
    assert PrefixSelector(seed=3).sample(20) == PrefixSelector(seed=3).sample(20)
    assert PrefixSelector(seed=3).sample(20) != PrefixSelector(seed=4).sample(20)
    selector = _selector_with([math.log(2.0), 0.0, 0.0], 0.0)  # rho = [7/15, 4/15, 4/15]
    draws = selector.sample(30_000)
    assert draws.count(1.0) / 30_000 == pytest.approx(7 / 15, abs=0.015)
    assert draws.count(0.25) / 30_000 == pytest.approx(4 / 15, abs=0.015)
    assert selector.sample(0) == []


def test_update_edge_cases():
    selector = PrefixSelector()
    selector.update([], [])  # an empty batch leaves phi and b unchanged (App. B.4)
    assert selector.logits.tolist() == [0.0, 0.0, 0.0] and selector.baseline == 0.0 and selector.num_updates == 0
    with pytest.raises(ValueError, match="not one of"):
        selector.update([0.3], [1.0])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        selector.update([0.5], [1.5])
    with pytest.raises(ValueError, match="one per continuation"):
        selector.update([0.5, 1.0], [1.0])
    # Equal feedback at the baseline moves nothing; only the baseline tracks the mean.
    selector = _selector_with([0.0, 0.0, 0.0], 0.4)
    selector.update([1.0, 0.25], [0.4, 0.4])
    assert selector.logits.tolist() == [0.0, 0.0, 0.0] and selector.baseline == pytest.approx(0.4)


def test_mean_feedback_per_level():
    means = mean_feedback_per_level([1.0, 0.5, 0.5], [0.0, 0.2, 0.6], (1.0, 0.5, 0.25))
    assert means[1.0] == 0.0 and means[0.5] == pytest.approx(0.4) and math.isnan(means[0.25])


# ---------------------------------------------------------------------------------------------------------------
# Feedback (eq. 7) and acceptance (§4.3)
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "correct, same, ratio, weighting, expected",
    [
        (True, False, 0.4, True, 0.4),  # successful replacement: the surprisal fraction left to the model
        (True, False, 0.4, False, 1.0),  # ablation: the indicator
        (True, True, 0.4, True, 0.0),  # an exact copy of the reference is not a replacement
        (True, True, 0.4, False, 0.0),
        (False, False, 0.4, True, 0.0),
        (False, False, 0.4, False, 0.0),
        (True, False, 1.0, True, 1.0),  # empty prefix: S_0/S_0
    ],
)
def test_continuation_feedback(correct, same, ratio, weighting, expected):
    assert continuation_feedback(correct, same, ratio, surprisal_weighting=weighting) == expected


def test_continuation_feedback_rejects_a_ratio_outside_unit_interval():
    with pytest.raises(ValueError, match="S_t/S_0"):
        continuation_feedback(True, False, 1.2)


def _cands(spec: str) -> list[Candidate]:
    """'c0 f0 r0 c12' → correct/failed/reference-copy candidates with those prefix lengths."""
    kinds = {"c": (True, False), "f": (False, False), "r": (True, True)}
    return [Candidate(*kinds[item[0]], prefix_len=int(item[1:])) for item in spec.split()]


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("f0 f0 f5 f9", []),  # nothing correct → fall back to the reference
        ("r0 r5 f0", []),  # exact copies of the reference never count
        ("c0 c0 c0 c0 c0 c0", [0, 1, 2, 3]),  # at most 4, empty prefixes in index order
        ("c0 c0 c0 c0 c7", [0, 1, 2, 3]),  # 4 empty: no room for a guided one
        ("f0 c9 c0 c3 c0 c3", [2, 4, 3]),  # empties first, then ONE guided: shortest prefix, lowest index on ties
        ("c20 c10 f2 c30", [1]),  # only guided: one, the shortest correct (the failed shorter one is ignored)
        ("r0 c0 c4", [1, 2]),  # an empty-prefix reference copy is skipped
        ("c0 c0 c0 c5 c2", [0, 1, 2, 4]),  # 3 empty + the shortest guided fills the 4th slot
        ("", []),
    ],
)
def test_accept_candidates_paper_rule(spec, expected):
    assert accept_candidates(_cands(spec) if spec else []) == expected


def test_accept_candidates_custom_caps_and_validation():
    cands = _cands("c0 c0 c0 c6 c2 c4")
    assert accept_candidates(cands, max_total=4, max_empty=2, max_guided=1) == [0, 1, 4]
    assert accept_candidates(cands, max_total=4, max_empty=2, max_guided=3) == [0, 1, 4, 5]
    assert accept_candidates(cands, max_total=2, max_empty=4, max_guided=1) == [0, 1]
    assert accept_candidates(cands, max_total=4, max_empty=0, max_guided=1) == [4]
    with pytest.raises(ValueError, match="prefix_len"):
        accept_candidates([Candidate(True, False, -1)])
    with pytest.raises(ValueError, match="max_total"):
        accept_candidates(cands, max_total=0)


def test_choose_replacement_rows_is_distinct_seeded_and_uniform():
    generator = torch.Generator().manual_seed(0)
    rows = choose_replacement_rows(8, 4, generator)
    assert len(rows) == 4 and len(set(rows)) == 4 and all(0 <= r < 8 for r in rows)
    assert choose_replacement_rows(8, 4, torch.Generator().manual_seed(5)) == choose_replacement_rows(
        8, 4, torch.Generator().manual_seed(5)
    )
    assert choose_replacement_rows(8, 0, generator) == []
    assert sorted(choose_replacement_rows(3, 3, generator)) == [0, 1, 2]
    counts = [0] * 8
    for _ in range(4000):
        counts[choose_replacement_rows(8, 1, generator)[0]] += 1
    assert all(abs(c - 500) < 100 for c in counts), counts  # each row ~1/8 (sd ~21)
    with pytest.raises(ValueError, match="num_inserts"):
        choose_replacement_rows(3, 4)
