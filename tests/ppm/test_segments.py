"""Segmentation of completions into K segments (PPM Alg. 1, App. B Fig. 7) and token-level expansion."""

from __future__ import annotations

import pytest
import torch

from ppm_trl.advantages import expand_segment_values
from ppm_trl.ppm.ppm_estimators import ppm_segment_advantages
from ppm_trl.ppm.segmentation import (
    equal_chunk_segment_ids,
    nonempty_segments,
    segment_prefix_lengths,
    segment_token_counts,
    turn_prefix_lengths,
    turn_segment_ids,
)

pytestmark = pytest.mark.fast  # `make test-fast`: seconds, no trainer step, no subprocess run

def _mask(lengths, width):
    return (torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).long()


# ---------------------------------------------------------------------------------------------- equal chunks
def test_equal_chunks_are_chunks_of_the_budget_not_of_the_completion():
    # Budget L = 8, K = 4 → chunks of 2 tokens. Completions of 8, 3 and 0 tokens padded to T = 8.
    ids = equal_chunk_segment_ids(_mask([8, 3, 0], 8), max_completion_length=8, num_segments=4)
    assert ids.tolist() == [
        [0, 0, 1, 1, 2, 2, 3, 3],
        [0, 0, 1, -1, -1, -1, -1, -1],  # short completion: segments 2 and 3 empty
        [-1] * 8,
    ]
    assert ids.dtype == torch.long


def test_equal_chunks_when_budget_not_divisible():
    # L = 10, K = 4: segment = floor(t·4/10) → t=0..2 → 0, 3..4 → 1, 5..7 → 2, 8..9 → 3 (sizes 3,2,3,2).
    ids = equal_chunk_segment_ids(torch.ones(1, 10), 10, 4)
    assert ids.tolist() == [[0, 0, 0, 1, 1, 2, 2, 2, 3, 3]]
    # L = 5, K = 4: floor(t·4/5) → 0,0,1,2,3: no empty segment for a full-length completion.
    assert equal_chunk_segment_ids(torch.ones(1, 5), 5, 4).tolist() == [[0, 0, 1, 2, 3]]
    # Tokens past the budget (T = 7 > L = 5) join the last segment.
    assert equal_chunk_segment_ids(torch.ones(1, 7), 5, 4).tolist() == [[0, 0, 1, 2, 3, 3, 3]]


def test_prefix_lengths_and_valid_for_equal_chunks():
    # L = 10, K = 4: chunk ends ceil(k·10/4) = 3, 5, 8, 10.
    lengths = torch.tensor([10, 4, 0, 6, 12])
    prefix = segment_prefix_lengths(lengths, 10, 4)
    assert prefix.tolist() == [
        [3, 5, 8, 10],
        [3, 4, 4, 4],
        [0, 0, 0, 0],
        [3, 5, 6, 6],
        [3, 5, 8, 12],  # overran the budget: the extra tokens are in the last chunk
    ]
    assert nonempty_segments(prefix).tolist() == [
        [True, True, True, True],
        [True, True, False, False],
        [False, False, False, False],
        [True, True, True, False],
        [True, True, True, True],
    ]


def test_prefix_lengths_agree_with_segment_ids():
    lengths = torch.tensor([0, 1, 2, 5, 7, 9, 13, 16])
    ids = equal_chunk_segment_ids(_mask(lengths.tolist(), 16), 13, 3)
    counted = torch.cumsum(segment_token_counts(ids, 3), dim=1)
    assert torch.equal(counted, segment_prefix_lengths(lengths, 13, 3))


def test_nonempty_segments_are_the_segments_with_tokens_for_every_segmentation():
    lengths = torch.tensor([0, 1, 2, 5, 7, 9, 13, 16])
    ids = equal_chunk_segment_ids(_mask(lengths.tolist(), 16), 13, 3)
    assert torch.equal(nonempty_segments(segment_prefix_lengths(lengths, 13, 3)), segment_token_counts(ids, 3) > 0)
    tool_mask = torch.tensor([[1, 0, 1, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    completion_mask = _mask([7, 4, 0], 7)
    turns = turn_segment_ids(tool_mask, completion_mask, 4)
    assert torch.equal(nonempty_segments(turn_prefix_lengths(tool_mask, completion_mask, 4)),
                       segment_token_counts(turns, 4) > 0)
    with pytest.raises(ValueError, match=r"prefix_lengths must be \(B, K\)"):
        nonempty_segments(torch.tensor([3, 5]))


@pytest.mark.parametrize("length, k", [(0, 4), (8, 0), (8.0, 4), (True, 4)])
def test_equal_chunk_argument_errors(length, k):
    with pytest.raises(ValueError):
        equal_chunk_segment_ids(torch.ones(1, 4), length, k)


def test_lengths_must_be_non_negative_integers():
    with pytest.raises(ValueError, match=">= 0"):
        segment_prefix_lengths(torch.tensor([3, -1]), 8, 4)
    with pytest.raises(ValueError, match="integer"):
        segment_prefix_lengths(torch.tensor([3.0]), 8, 4)


# ------------------------------------------------------------------------------------------------------ turns
def test_turn_segments_follow_model_runs():
    # Row 0: turn A (2 tokens), tool output (2), turn B (1), tool (1), turn C (2), then padding (tool_mask pads with 1).
    tool_mask = torch.tensor([
        [1, 1, 0, 0, 1, 0, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
        [0, 1, 1, 0, 1, 1, 1, 1, 1, 1],
    ])
    completion_mask = _mask([8, 5, 5], 10)
    ids = turn_segment_ids(tool_mask, completion_mask, num_segments=4)
    assert ids.tolist() == [
        [0, 0, 0, 0, 1, 1, 2, 2, -1, -1],  # tool tokens take the id of the turn they follow
        [0, 0, 0, 0, 0, -1, -1, -1, -1, -1],  # one turn: segments 1..3 empty
        [0, 0, 0, 0, 1, -1, -1, -1, -1, -1],  # leading tool token joins turn 0
    ]
    assert turn_prefix_lengths(tool_mask, completion_mask, 4).tolist() == [[4, 6, 8, 8], [5, 5, 5, 5], [4, 5, 5, 5]]
    assert nonempty_segments(turn_prefix_lengths(tool_mask, completion_mask, 4)).tolist() == [
        [True, True, True, False],
        [True, False, False, False],
        [True, True, False, False],
    ]


def test_excess_turns_merge_into_last_segment():
    tool_mask = torch.tensor([[1, 0, 1, 0, 1, 0, 1]])  # four turns of one token
    ids = turn_segment_ids(tool_mask, torch.ones(1, 7), num_segments=2)
    assert ids.tolist() == [[0, 0, 1, 1, 1, 1, 1]]
    assert turn_prefix_lengths(tool_mask, torch.ones(1, 7), 2).tolist() == [[2, 7]]


def test_turns_without_tool_mask_and_truncated_rows():
    completion_mask = _mask([3, 0], 4)  # row 1: TRL's mask_truncated_completions zeroed it
    assert turn_segment_ids(None, completion_mask, 3).tolist() == [[0, 0, 0, -1], [-1, -1, -1, -1]]
    assert nonempty_segments(turn_prefix_lengths(None, completion_mask, 3)).tolist() == [[True, False, False],
                                                                              [False, False, False]]
    with pytest.raises(ValueError, match="shape"):
        turn_segment_ids(torch.ones(2, 3), completion_mask, 3)


# -------------------------------------------------------------------------------------------------- expansion
def test_expand_segment_values_gathers_and_zeroes_padding():
    values = torch.tensor([[0.5, -1.0, 2.0], [float("nan"), 3.0, 4.0]], dtype=torch.float64)
    ids = torch.tensor([[0, 0, 1, 2, -1], [1, 2, 2, -1, -1]])
    out = expand_segment_values(values, ids)
    assert out.dtype == torch.float64
    assert out.tolist() == [[0.5, 0.5, -1.0, 2.0, 0.0], [3.0, 4.0, 4.0, 0.0, 0.0]]


def test_expand_segment_values_rejects_bad_ids():
    with pytest.raises(ValueError, match="-1..1"):
        expand_segment_values(torch.zeros(1, 2), torch.tensor([[0, 2]]))
    with pytest.raises(ValueError, match=r"\(B, K\)"):
        expand_segment_values(torch.zeros(2, 2), torch.tensor([[0, 1]]))


def test_every_token_of_segment_k_carries_segment_k_advantage():
    # Group of 2, L = 8, K = 4 (chunks of 2). Row 0 full length, row 1 three tokens (segments 2, 3 empty).
    progress = torch.tensor([[0.25, 0.5, 0.75, 1.0], [0.5, 0.5, 0.0, 0.0]])
    lengths = torch.tensor([8, 3])
    valid = nonempty_segments(segment_prefix_lengths(lengths, 8, 4))
    adv = ppm_segment_advantages(progress, torch.tensor([1.0, 0.0]), group_size=2, valid=valid)
    # r row 0 = [.25,.25,.25,.25] + 1 = 1.25 each; row 1 = [.5, 0, 0(empty), 0(empty)].
    # Segment means: [.875, .625, .625, .625] → row 0: [.375, .625, .625, .625]; row 1: [-.375, -.625, ...].
    tokens = expand_segment_values(adv, equal_chunk_segment_ids(_mask(lengths.tolist(), 8), 8, 4))
    assert tokens.tolist() == [
        [0.375, 0.375, 0.625, 0.625, 0.625, 0.625, 0.625, 0.625],
        [-0.375, -0.375, -0.625, 0.0, 0.0, 0.0, 0.0, 0.0],
    ]


# ------------------------------------------------------------------------------------------- delimiter segments
def _char_codec(pieces_per_id=None):
    """decode: token id → its string (a multi-character token when `pieces_per_id` says so)."""
    table = pieces_per_id or {}

    def decode(ids):
        return "".join(table.get(i, chr(i)) for i in ids)

    return decode


def _ids(text):
    return [ord(c) for c in text]


def test_delimiter_prefixes_cut_after_each_newline_and_merge_the_rest_into_the_last_segment():
    from ppm_trl.ppm.segmentation import delimiter_prefix_lengths

    decode = _char_codec()
    rows = [_ids("ab\ncd\nef"), _ids("ab\n"), _ids("x"), _ids("a\nb\nc\nd\ne"), _ids("")]
    prefix = delimiter_prefix_lengths(rows, decode, r"\n", 3)
    assert prefix.tolist() == [
        [3, 6, 8],  # three pieces, one per segment
        [3, 3, 3],  # a trailing newline ends the last piece, it opens no empty one
        [1, 1, 1],  # no delimiter: one piece, segments 2-3 empty
        [2, 4, 9],  # five pieces: pieces 3-5 merge into segment 3
        [0, 0, 0],
    ]


def test_delimiter_cut_inside_a_multi_character_token_ends_after_that_token():
    from ppm_trl.ppm.segmentation import delimiter_prefix_lengths

    # token 1000 = "x\ny" (the newline sits inside it), token 1001 = "\n\n" (two boundaries in one token)
    decode = _char_codec({1000: "x\ny", 1001: "\n\n"})
    assert delimiter_prefix_lengths([[97, 1000, 98, 99]], decode, r"\n", 2).tolist() == [[2, 4]]
    # "a" + "\n\n" + "b": boundaries after chars 2 and 3 are both inside token 1 → segment 2 is empty
    assert delimiter_prefix_lengths([[97, 1001, 98]], decode, r"\n", 3).tolist() == [[2, 2, 3]]


def test_delimiter_is_a_regex_and_bad_ones_are_clear_errors():
    from ppm_trl.ppm.segmentation import compile_delimiter, delimiter_prefix_lengths

    decode = _char_codec()
    text = _ids("step 1: a. Step 2: b. Step 3: c")
    assert delimiter_prefix_lengths([text], decode, r"\.\s+", 3).tolist() == [[11, 22, 31]]
    for bad, message in (("(", "not a valid regular expression"), ("x*", "matches the empty string"),
                         ("", "non-empty"), (None, "non-empty")):
        with pytest.raises(ValueError, match=message):
            compile_delimiter(bad)


def test_prefix_segment_ids_follow_the_prefixes_and_skip_empty_segments():
    from ppm_trl.ppm.segmentation import prefix_segment_ids

    prefix = torch.tensor([[3, 5, 5, 8], [2, 2, 2, 2]])
    mask = torch.tensor([[1] * 8, [1, 1] + [0] * 6])
    ids = prefix_segment_ids(prefix, mask)
    assert ids.tolist() == [[0, 0, 0, 1, 1, 3, 3, 3], [0, 0, -1, -1, -1, -1, -1, -1]]
    # The counts per segment are the prefix differences (the (B, T) contract every segmentation shares).
    assert segment_token_counts(ids, 4).tolist() == [[3, 2, 0, 3], [2, 0, 0, 0]]
    with pytest.raises(ValueError, match=r"\(B, K\)"):
        prefix_segment_ids(torch.tensor([3, 5]), mask)
