"""PPM's segmentations, under the module path they have always had: the code is `ppm_trl/ppm/segmentation.py` (the
pure pieces only PPM uses live in its folder), and `expand_segment_values`, which the trainers' seam uses for any
per-segment advantage, is `ppm_trl.advantages`'."""

from .advantages import expand_segment_values
from .ppm.segmentation import (
    SEGMENTATIONS,
    Segmentation,
    SegmentationSettings,
    compile_delimiter,
    delimiter_prefix_lengths,
    equal_chunk_segment_ids,
    nonempty_segments,
    prefix_segment_ids,
    segment_prefix_lengths,
    segment_token_counts,
    turn_prefix_lengths,
    turn_segment_ids,
)

__all__ = ["SEGMENTATIONS", "Segmentation", "SegmentationSettings", "compile_delimiter", "delimiter_prefix_lengths",
           "equal_chunk_segment_ids", "expand_segment_values", "nonempty_segments", "prefix_segment_ids",
           "segment_prefix_lengths", "segment_token_counts", "turn_prefix_lengths", "turn_segment_ids"]
