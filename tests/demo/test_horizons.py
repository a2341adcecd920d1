"""The rule that picks the demo's and the benchmarks' horizons from a warm start's profile (`demo.horizons`)."""

from __future__ import annotations

import pytest

from ppm_trl.demo.horizons import HorizonRule, choose_horizons, format_profile

pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

def _profile(rows):
    """{n: (all_correct, [line accuracies])} → the profile shape `evaluate_policy` returns."""
    return {n: {"all_correct": ac, "per_subproblem": sum(lines) / len(lines), "per_point": lines}
            for n, (ac, lines) in rows.items()}


def test_the_cliff_is_the_largest_learnable_low_nonzero_horizon_and_easy_is_below_it():
    profile = _profile({
        2: (0.90, [0.99, 0.95]),
        3: (0.55, [0.99, 0.9, 0.8]),
        4: (0.30, [0.99, 0.9, 0.8, 0.6]),
        5: (0.08, [0.99, 0.9, 0.7, 0.5, 0.3]),
        6: (0.02, [0.99, 0.9, 0.7, 0.5, 0.3, 0.25]),
        7: (0.0, [0.99, 0.9, 0.7, 0.5, 0.3, 0.2, 0.1]),
    })
    chosen, reasons = choose_horizons(profile)
    assert chosen == {"cliff": 6, "easy": 4}
    assert reasons[6].startswith("CLIFF") and "line 6 at 0.250" in reasons[6]
    assert "cliff candidate" in reasons[5]  # qualifies, but 6 is larger
    assert "all-correct is 0" in reasons[7] and reasons[4].startswith("EASY")
    assert "all-correct 0.550 > 0.1" in reasons[3]


def test_a_wall_is_not_a_cliff_even_with_the_right_base_rate():
    # The old demo's failure: n = 6 had a low all-correct rate but line 5 at 0.04 — a wall no estimator climbs.
    profile = _profile({
        4: (0.30, [0.99, 0.9, 0.8, 0.6]),
        5: (0.07, [0.99, 0.71, 0.38, 0.41, 0.30]),
        6: (0.03, [0.99, 0.71, 0.38, 0.41, 0.04, 0.5]),
    })
    chosen, reasons = choose_horizons(profile)
    assert chosen["cliff"] == 5
    assert "line 5 is right only 0.040" in reasons[6] and "a wall" in reasons[6]


def test_a_non_monotone_profile_disqualifies_the_horizons_after_the_rise():
    profile = _profile({
        4: (0.05, [0.9] * 4),
        5: (0.09, [0.9] * 5),  # rises: 4 → 5
        6: (0.03, [0.9] * 6),
    })
    chosen, reasons = choose_horizons(profile)
    assert chosen["cliff"] == 4
    assert "monotonically" in reasons[5] and "monotonically" in reasons[6]


def test_nothing_qualifies_gives_none_with_a_reason_for_every_horizon():
    profile = _profile({3: (0.5, [0.9] * 3), 4: (0.0, [0.9, 0.9, 0.1, 0.0])})
    chosen, reasons = choose_horizons(profile, HorizonRule(easy_min=0.6))
    assert chosen == {"cliff": None, "easy": None}
    assert set(reasons) == {3, 4} and all(reason.startswith("not a cliff") for reason in reasons.values())
    text = format_profile(profile, reasons)
    assert "n= 3: all-correct 0.500" in text and "lines [0.90 0.90 0.10 0.00]" in text


def test_rule_thresholds_are_settings():
    profile = _profile({5: (0.15, [0.9] * 5), 6: (0.05, [0.15] * 6)})
    assert choose_horizons(profile)[0]["cliff"] is None
    assert choose_horizons(profile, HorizonRule(cliff_max=0.2))[0]["cliff"] == 5
    assert choose_horizons(profile, HorizonRule(min_line=0.1))[0]["cliff"] == 6


def test_lucky_samples_and_sampler_noise_do_not_decide():
    profile = _profile({
        3: (0.30, [0.7] * 3),
        4: (0.050, [0.6] * 4),
        5: (0.060, [0.6] * 5),  # a rise within the tolerance: still monotone
        6: (0.025, [0.55] * 6),
        7: (0.008, [0.5] * 7),  # two lucky samples of 256: not a cliff
    })
    chosen, reasons = choose_horizons(profile)
    assert chosen == {"cliff": 6, "easy": 3}
    assert "< 0.02" in reasons[7] and "cliff candidate" in reasons[5]
    strict = HorizonRule(monotone_tolerance=0.0)
    assert choose_horizons(profile, strict)[0]["cliff"] == 4  # 5 rose above 4, so 5 and 6 no longer qualify
    assert choose_horizons(profile, HorizonRule(cliff_min=0.005))[0]["cliff"] == 7
