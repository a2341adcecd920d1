"""ARG's pure core under the module path it has always had: the code lives in ARG's folder, `ppm_trl/arg/`
(`surprisal.py`, `prefixes.py`, `selector.py`, `acceptance.py`, `references.py`, `guidance_step.py`), where
`ppm_trl.arg` exports every name below. These are the very same objects (one `PrefixSelector` class).
"""

from .arg.acceptance import (  # noqa: F401
    Candidate,
    accept_candidates,
    choose_replacement_rows,
    continuation_feedback,
)
from .arg.guidance_step import (  # noqa: F401
    ContinuationOutcome,
    FailedGroup,
    FailureScan,
    GroupOutcome,
    GroupPlan,
    GroupStatus,
    GuidanceMode,
    VerifiedContinuation,
    all_failure_groups,
    guidance_metrics,
    plan_guided_group,
    resolve_group,
    scan_failures,
    screen_reference,
    selector_feedback,
)
from .arg.prefixes import (  # noqa: F401
    EMPTY_PREFIX,
    GuidedPrefix,
    boundary_char_positions,
    plan_reference_prefixes,
    prefix_budget,
    snap_prefix_length,
    valid_prefix_cuts,
)
from .arg.references import (  # noqa: F401
    check_references,
    reference_problem,
)
from .arg.selector import (  # noqa: F401
    PrefixSelector,
    mean_feedback_per_level,
)
from .arg.surprisal import (  # noqa: F401
    batched_surprisal_prefix_lengths,
    check_alpha,
    suffix_surprisals,
    surprisal_prefix_length,
)
