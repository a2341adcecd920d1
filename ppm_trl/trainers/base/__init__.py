"""The seam with TRL's GRPOTrainer: `MethodTrainer` and its parts. Only this package names TRL's (and Trainer's)
private members.

It overrides each TRL hook once and gives the method trainers public, documented hooks instead:

- `on_rollout(rollout) -> Rollout` — after TRL generated (and decoded) the rows, before anything is scored: the rows
  may be replaced (ARG). The base then recomputes TRL's completion statistics so that they describe the FINAL rows.
- `on_final_rollout(rollout) -> pending` — training only, after every `on_rollout` of the MRO: the rows are final
  and TRL's log-prob passes come next. Start slow scoring here (`run_in_background`) and RETURN what the advantage
  hook needs to collect it, a frozen dataclass of the method's (PPM's `PendingProgress`: the scored ids, prefix
  lengths and Future; PAPO's `PendingProcessScores`: the early outcome, the judged rows and the Future); the base
  keeps it for this batch only and hands it over as `ScoredBatch.pending`.
- `compute_advantages(batch: ScoredBatch) -> Advantages | None` — after TRL computed its own advantages; `batch`
  holds everything the step knows by then, built once by the base: this process's rows, completions and completion
  ids, the gathered rewards and weighted outcome, this process's masks, its slice of the gathered batch (`local`)
  and the pending work. The method's (B,) or per-segment (B, K) values on the gathered batch: the base slices them
  to this process, expands segments to tokens, removes dropped rows from the loss (recounting
  `num_items_in_batch`) and replaces TRL's logged advantages. Hooks keep nothing on `self` between them (a
  subclass that still defines the removed `on_scores` hook, or the old `compute_advantages(completion_mask,
  tool_mask)`, is refused at construction).
- `extra_checkpoint_state()` / `load_extra_checkpoint_state(states)` — JSON files saved with every checkpoint.

Each part is one file, readable in one sitting:

- `contract.py` — the supported TRL versions (checked on import) and every TRL internal the seam touches, declared
  for `tests/trainers/test_trl_seam.py`;
- `hooks.py` — the hooks above, the data they exchange (`Rollout`, `ScoredBatch`, `Advantages`) and TRL's hooks that
  call them (`_generate`, `_calculate_rewards`, `_generate_and_score_completions`, each overridden once);
- `generation.py` — completions, log-probs and decoding through the trainer's own backend (HF, vLLM colocate or
  server), for a method that generates more than TRL's rollouts (ARG);
- `checkpoints.py` and `preemption.py` — complete checkpoints, which one to resume, untrusted files as one
  `CheckpointError`; `train` that resumes, saves the method's state and stops cleanly on SIGTERM (status 143) or
  Ctrl-C (130);
- `model_card.py` and `hub.py` — the method's model card, and Hub uploads without the run's private files;
- `method_trainer.py` — `MethodTrainer`, those parts put together, with the TRL state a method reads by name
  (`outcome_reward_weights`, `eos_ids`, `masks_truncated_completions`, `tokenizer`, `is_multimodal`, ...);
- `scored_method.py` — `ScoredMethodTrainer`, what PPM and PAPO share: a method with one scorer (config, columns,
  scorer, judge callbacks, the scorer's counters gathered over the processes).

The seam is closed (`tests/trainers/test_trl_seam.py`): outside this package, no code names a TRL/Trainer private member or
passes a private parameter, imports from a TRL submodule what `trl` does not export, reads trainer state TRL sets
but does not document (only `DOCUMENTED_TRAINER_STATE`), or writes into an object TRL owns.
"""

# First: the TRL version check runs before any TRL internal is imported.
from .contract import (  # isort: skip
    COMPLETION_STATISTICS,
    DOCUMENTED_TRAINER_STATE,
    TRL_PRIVATE_ATTRIBUTES,
    TRL_PRIVATE_METHODS,
    TRL_PRIVATE_PARAMETERS,
    TRL_SUBMODULE_IMPORTS,
    TRL_SUPPORTED,
    VLLM_GENERATION_ATTRIBUTES,
)
from .checkpoints import (
    CHECKPOINT_COMPLETE,
    RESUME_LAST,
    TRAINER_STATE,
    TRAINER_STATE_TYPES,
    CheckpointError,
    check_checkpoint_contents,
    checkpoint_problem,
    reached_max_steps,
    read_trainer_state,
    resolve_resume_checkpoint,
    write_completion_marker,
)
from .generation import plan_generation_calls
from .hooks import Advantages, Rollout, ScoredBatch, completion_statistics
from .hub import HUB_API, RUN_PRIVATE_FILES, run_private_patterns
from .method_trainer import MethodTrainer, RunReport
from .model_card import (
    CARD_JUDGE_SETTINGS,
    CARD_TRL_SETTINGS,
    base_model_license,
    card_training_record,
    describe_dataset,
    render_training_record,
)
from .run_lock import OutputDirInUse, output_dir_lock
from .scored_method import ScoredMethodTrainer

__all__ = [
    "CARD_JUDGE_SETTINGS", "CARD_TRL_SETTINGS", "CHECKPOINT_COMPLETE", "COMPLETION_STATISTICS",
    "DOCUMENTED_TRAINER_STATE", "HUB_API", "RESUME_LAST", "RUN_PRIVATE_FILES", "TRAINER_STATE", "TRAINER_STATE_TYPES",
    "TRL_PRIVATE_ATTRIBUTES", "TRL_PRIVATE_METHODS", "TRL_PRIVATE_PARAMETERS", "TRL_SUBMODULE_IMPORTS",
    "TRL_SUPPORTED", "VLLM_GENERATION_ATTRIBUTES", "Advantages", "CheckpointError", "MethodTrainer", "OutputDirInUse",
    "Rollout", "RunReport", "ScoredBatch", "ScoredMethodTrainer", "base_model_license", "card_training_record", "check_checkpoint_contents",
    "checkpoint_problem", "completion_statistics", "describe_dataset", "output_dir_lock", "plan_generation_calls",
    "reached_max_steps", "read_trainer_state", "render_training_record", "resolve_resume_checkpoint",
    "run_private_patterns", "write_completion_marker",
]
