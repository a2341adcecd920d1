"""Splitting completions into the K segments c_1..c_K of Progressive Point Matching (PPM paper Alg. 1, App. B).

Three segmentations, each as a (B, T) LongTensor of segment ids in 0..K-1 (-1 on padding):

* equal chunks of the TRAINING BUDGET (App. B, Fig. 7 middle): segment boundaries depend only on the token position,
  never on the completion's own length, so a short completion has empty trailing segments (reward 0). The chunk
  size is the real number max_completion_length / K (as in the paper); token t belongs to segment floor(t·K / L).
  When L is divisible by K this is floor(t / (L/K)); when it is not, chunk sizes differ by at most one token
  (L=10, K=4 → 3,2,3,2 tokens) and every segment of a full-length completion is non-empty, which a rounded-up chunk
  size ceil(L/K) would not guarantee (L=5, K=4 → 2,2,1,0).
* turns (multi-turn / tool rollouts): each assistant turn is one segment. In TRL 1.16 a tool-loop completion is one
  token sequence with `tool_mask` (1 = model token, 0 = tool-output token). A turn is a maximal run of model tokens;
  the tool-output tokens that follow a turn belong to that turn's segment: they are the environment's response to
  that turn's action, so prefix c_1..c_k is the state reached after action k (TRL masks them out of the loss).

* delimiter (single-turn structure, e.g. one line per sub-problem): a segment ends at each match of a regex in
  the decoded completion (default a newline), the delimiter included — the single-turn analogue of the paper's
  per-turn segments (Multi-Countdown: one sub-problem per segment). Pieces beyond K merge into the last segment;
  with fewer pieces the trailing segments are empty. A match that ends inside a token ends its segment after
  that token.

Prefix lengths (B, K) count the completion tokens of c_1..c_k, so a scorer judges `completion_ids[i, :len]`, and
say which segments are empty (`nonempty_segments`). `SEGMENTATIONS` is the one table `PPMConfig.segmentation` picks
from (its accepted values are the table's keys): each entry gives the prefix lengths the scorer judges and the
segment id of every token for the loss. Per-segment values become per-token ones with
`ppm_trl.advantages.expand_segment_values`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch


def _check_counts(max_completion_length: int, num_segments: int) -> None:
    if isinstance(max_completion_length, bool) or not isinstance(max_completion_length, int) or max_completion_length < 1:
        raise ValueError(f"max_completion_length must be a positive int, got {max_completion_length!r}")
    if isinstance(num_segments, bool) or not isinstance(num_segments, int) or num_segments < 1:
        raise ValueError(f"num_segments must be a positive int, got {num_segments!r}")


def _as_mask(mask: torch.Tensor, name: str) -> torch.Tensor:
    mask = torch.as_tensor(mask)
    if mask.dim() != 2:
        raise ValueError(f"{name} must be a (B, T) tensor, got shape {tuple(mask.shape)}")
    return mask.bool()


def _as_lengths(lengths) -> torch.Tensor:
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1 or lengths.is_floating_point() or lengths.is_complex():
        raise ValueError(f"lengths must be a 1-D integer tensor of completion token counts, got {lengths!r}")
    if (lengths < 0).any():
        raise ValueError(f"lengths must be >= 0, got {lengths.tolist()}")
    return lengths.long()


# ----------------------------------------------------------------------------------------------- equal chunks
def equal_chunk_segment_ids(completion_mask: torch.Tensor, max_completion_length: int,
                            num_segments: int) -> torch.Tensor:
    """(B, T) segment ids: token t → floor(t·K / max_completion_length); padding (mask 0) → -1.

    Tokens past the budget (only possible if a rollout overran `max_completion_length`) join the last segment.
    """
    _check_counts(max_completion_length, num_segments)
    mask = _as_mask(completion_mask, "completion_mask")
    positions = torch.arange(mask.shape[1], device=mask.device)
    ids = torch.clamp((positions * num_segments) // max_completion_length, max=num_segments - 1)
    return torch.where(mask, ids.unsqueeze(0).expand_as(mask), torch.full_like(ids, -1).unsqueeze(0))


def segment_prefix_lengths(lengths, max_completion_length: int, num_segments: int) -> torch.Tensor:
    """(B, K) tokens in prefix c_1..c_k of equal budget chunks: min(length, ceil(k·L/K)), and `length` for k = K.

    Pass the real completion lengths (before `mask_truncated_completions` zeroes a truncated row's mask).
    """
    _check_counts(max_completion_length, num_segments)
    lengths = _as_lengths(lengths)
    k = torch.arange(1, num_segments + 1, device=lengths.device)
    ends = (k * max_completion_length + num_segments - 1) // num_segments  # ceil(k·L/K): first token of chunk k+1
    prefix = torch.minimum(lengths.unsqueeze(1), ends.unsqueeze(0))
    prefix[:, -1] = lengths  # tokens past the budget belong to the last chunk
    return prefix


def nonempty_segments(prefix_lengths) -> torch.Tensor:
    """(B, K) bool: segment k holds at least one completion token (c_1..c_k is longer than c_1..c_{k−1}).

    The one validity rule of every segmentation, read from its (B, K) prefix lengths; an empty segment gets reward 0
    (`advantages.ppm_segment_rewards(valid=...)`).
    """
    prefix = torch.as_tensor(prefix_lengths)
    if prefix.dim() != 2:
        raise ValueError(f"prefix_lengths must be (B, K), got shape {tuple(prefix.shape)}")
    previous = torch.cat([torch.zeros_like(prefix[:, :1]), prefix[:, :-1]], dim=1)
    return prefix > previous


# ------------------------------------------------------------------------------------------------------ turns
def turn_segment_ids(tool_mask: torch.Tensor | None, completion_mask: torch.Tensor,
                     num_segments: int) -> torch.Tensor:
    """(B, T) segment ids where each assistant turn (maximal run of model tokens) is one segment.

    Tool-output tokens take the id of the turn they follow; tool tokens before the first model token (a rollout
    that starts with environment text) join turn 0. Turns beyond K merge into the last segment; with fewer turns
    the trailing segments are empty. `tool_mask=None` (no tools) makes the whole completion turn 0. Padding → -1.
    """
    _check_counts(1, num_segments)
    completion = _as_mask(completion_mask, "completion_mask")
    if tool_mask is None:
        model = completion
    else:
        model = _as_mask(tool_mask, "tool_mask")
        if model.shape != completion.shape:
            raise ValueError(f"tool_mask shape {tuple(model.shape)} != completion_mask shape {tuple(completion.shape)}")
        model = model & completion  # TRL pads tool_mask with 1
    previous = torch.cat([torch.zeros_like(model[:, :1]), model[:, :-1]], dim=1)
    turn = torch.cumsum((model & ~previous).long(), dim=1) - 1
    turn = turn.clamp(min=0, max=num_segments - 1)
    return torch.where(completion, turn, torch.full_like(turn, -1))


def segment_token_counts(segment_ids: torch.Tensor, num_segments: int, token_mask: torch.Tensor | None = None
                         ) -> torch.Tensor:
    """(B, K) number of tokens with each segment id (optionally only tokens where `token_mask` is true)."""
    ids = torch.as_tensor(segment_ids)
    keep = ids >= 0 if token_mask is None else (ids >= 0) & _as_mask(token_mask, "token_mask")
    counts = torch.zeros(ids.shape[0], num_segments + 1, dtype=torch.long, device=ids.device)
    # Dropped tokens go to the spare column num_segments, then it is cut off.
    slot = torch.where(keep, ids, torch.full_like(ids, num_segments))
    counts.scatter_add_(1, slot.long(), torch.ones_like(slot, dtype=torch.long))
    return counts[:, :num_segments]


def turn_prefix_lengths(tool_mask: torch.Tensor | None, completion_mask: torch.Tensor,
                        num_segments: int) -> torch.Tensor:
    """(B, K) completion tokens in c_1..c_k for turn segments (turn k plus the tool output that answers it)."""
    ids = turn_segment_ids(tool_mask, completion_mask, num_segments)
    return torch.cumsum(segment_token_counts(ids, num_segments), dim=1)


# -------------------------------------------------------------------------------------------------- delimiter
def compile_delimiter(delimiter) -> re.Pattern:
    """The compiled segment delimiter; a non-string, an invalid regex or one that matches "" is a ValueError."""
    if not isinstance(delimiter, str) or not delimiter:
        raise ValueError(f"segment_delimiter must be a non-empty regular expression, got {delimiter!r}")
    try:
        pattern = re.compile(delimiter)
    except re.error as error:
        raise ValueError(f"segment_delimiter={delimiter!r} is not a valid regular expression: {error}") from None
    if pattern.search("") is not None:
        raise ValueError(f"segment_delimiter={delimiter!r} matches the empty string; it must match at least one "
                         "character (e.g. '\\n')")
    return pattern


def delimiter_prefix_lengths(completion_ids: Sequence[Sequence[int]], decode: Callable[[Sequence[int]], str],
                             delimiter: str, num_segments: int) -> torch.Tensor:
    """(B, K) completion tokens in c_1..c_k when each match of the regex `delimiter` closes a segment.

    `decode(ids) -> str` is the tokenizer's decode (the same text the scorer reads). Piece j ends at the first token
    count whose decoded prefix covers the j-th match's end; pieces beyond K merge into segment K, whose prefix is
    always the whole completion; missing pieces leave trailing segments empty (their prefix repeats the previous).
    """
    _check_counts(1, num_segments)
    pattern = compile_delimiter(delimiter)
    prefix = torch.empty(len(completion_ids), num_segments, dtype=torch.long)
    for row, ids in enumerate(completion_ids):
        ids = list(ids)
        text = decode(ids)
        ends = [m.end() for m in pattern.finditer(text) if m.end() < len(text)][: num_segments - 1]
        cuts, low = [], 0
        for end in ends:
            low = _tokens_covering(ids, decode, end, low)
            cuts.append(low)
        cuts += [len(ids)] * (num_segments - len(cuts))
        prefix[row] = torch.tensor(cuts, dtype=torch.long)
    return prefix


def _tokens_covering(ids: list[int], decode, chars: int, low: int) -> int:
    """The fewest tokens (>= low) whose decoded text has at least `chars` characters (binary search)."""
    high = len(ids)
    while low < high:
        middle = (low + high) // 2
        if len(decode(ids[:middle])) >= chars:
            high = middle
        else:
            low = middle + 1
    return low


def prefix_segment_ids(prefix_lengths: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) segment ids from (B, K) prefix lengths: token t is in the first segment k with t < prefix[k].

    Empty segments get no token; tokens past prefix[K-1] (none for a consistent input) join the last segment.
    """
    mask = _as_mask(completion_mask, "completion_mask")
    prefix = torch.as_tensor(prefix_lengths, device=mask.device).long()
    if prefix.dim() != 2 or prefix.shape[0] != mask.shape[0]:
        raise ValueError(f"prefix_lengths must be (B, K) with B = {mask.shape[0]}, got {tuple(prefix.shape)}")
    positions = torch.arange(mask.shape[1], device=mask.device)
    ids = (prefix.unsqueeze(1) <= positions.view(1, -1, 1)).sum(dim=2).clamp(max=prefix.shape[1] - 1)
    return torch.where(mask, ids, torch.full_like(ids, -1))


# --------------------------------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class SegmentationSettings:
    """What a segmentation reads from the run's config (`PPMConfig`)."""

    num_segments: int  # K
    max_completion_length: int  # the training budget (equal chunks)
    delimiter: str = "\n"  # the regular expression that closes a segment (delimiter)

    @classmethod
    def of(cls, args) -> SegmentationSettings:
        return cls(args.num_segments, args.max_completion_length, args.segment_delimiter)


def _padded_masks(completion_ids, tool_masks):
    """(B, W) completion and tool masks (the tool mask None without tools) from per-row lists."""
    lengths = torch.tensor([len(ids) for ids in completion_ids], dtype=torch.long)
    width = max(int(lengths.max()), 1) if len(lengths) else 1
    completion_mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    tool_mask = None
    if tool_masks is not None:
        tool_mask = torch.ones(len(lengths), width, dtype=torch.bool)
        for i, row in enumerate(tool_masks):
            tool_mask[i, : len(row)] = torch.as_tensor(row, dtype=torch.bool)
    return completion_mask, tool_mask


def _equal_chunk_prefixes(completion_ids, tool_masks, decode, settings: SegmentationSettings) -> torch.Tensor:
    lengths = torch.tensor([len(ids) for ids in completion_ids], dtype=torch.long)
    return segment_prefix_lengths(lengths, settings.max_completion_length, settings.num_segments)


def _equal_chunk_ids(completion_mask, tool_mask, prefix_lengths, settings: SegmentationSettings) -> torch.Tensor:
    return equal_chunk_segment_ids(completion_mask, settings.max_completion_length, settings.num_segments)


def _turn_prefixes(completion_ids, tool_masks, decode, settings: SegmentationSettings) -> torch.Tensor:
    completion_mask, tool_mask = _padded_masks(completion_ids, tool_masks)
    return turn_prefix_lengths(tool_mask, completion_mask, settings.num_segments)


def _turn_ids(completion_mask, tool_mask, prefix_lengths, settings: SegmentationSettings) -> torch.Tensor:
    return turn_segment_ids(tool_mask, completion_mask, settings.num_segments)


def _delimiter_prefixes(completion_ids, tool_masks, decode, settings: SegmentationSettings) -> torch.Tensor:
    return delimiter_prefix_lengths(completion_ids, decode, settings.delimiter, settings.num_segments)


def _delimiter_ids(completion_mask, tool_mask, prefix_lengths, settings: SegmentationSettings) -> torch.Tensor:
    # This process's rows, cut where the scorer's prefixes were cut.
    return prefix_segment_ids(prefix_lengths.to(completion_mask.device), completion_mask)


def _no_check(settings: SegmentationSettings) -> None:
    return None


def _check_delimiter(settings: SegmentationSettings) -> None:
    compile_delimiter(settings.delimiter)  # a bad regex fails when the config is built, not at the first step


@dataclass(frozen=True)
class Segmentation:
    """One way to cut completions into K segments.

    `prefix_lengths(completion_ids, tool_masks, decode, settings)`: the (B, K) token counts of c_1..c_k that the
    scorer judges, from each row's completion ids (lists), its tool mask (lists, None without tools) and the
    tokenizer's `decode`. `segment_ids(completion_mask, tool_mask, prefix_lengths, settings)`: the (B, T) segment id
    of each token (-1 on padding) for the loss, from TRL's padded masks and the same rows' prefix lengths.
    `check(settings)` raises a ValueError for settings it cannot use (called when the config is built).
    """

    prefix_lengths: Callable[..., torch.Tensor]
    segment_ids: Callable[..., torch.Tensor]
    check: Callable[[SegmentationSettings], None] = field(default=_no_check)


SEGMENTATIONS: dict[str, Segmentation] = {
    "equal_chunks": Segmentation(_equal_chunk_prefixes, _equal_chunk_ids),
    "turns": Segmentation(_turn_prefixes, _turn_ids),
    "delimiter": Segmentation(_delimiter_prefixes, _delimiter_ids, _check_delimiter),
}
