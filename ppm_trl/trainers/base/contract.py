"""The contract with TRL: the supported versions (checked on import) and every TRL / Trainer internal the seam
touches, declared so that `tests/trainers/test_trl_seam.py` can check each one against the installed TRL — and so that no
module outside this package touches any other.
"""

from __future__ import annotations

import trl
from packaging.specifiers import SpecifierSet
from packaging.version import Version

TRL_SUPPORTED = SpecifierSet(">=1.16,<1.17")
if Version(trl.__version__) not in TRL_SUPPORTED:
    raise ImportError(
        f"ppm_trl's trainers support trl{TRL_SUPPORTED} but trl {trl.__version__} is installed: the base trainer "
        f"(ppm_trl/trainers/base/) relies on GRPOTrainer internals of those versions. Install `trl{TRL_SUPPORTED}`."
    )

# The private TRL / Trainer members the seam uses, with the leading parameters it passes (checked by
# tests/trainers/test_trl_seam.py: each tuple must be the start of the member's signature).
TRL_PRIVATE_METHODS = {
    "_generate": ("self", "prompts"),
    "_generate_single_turn": ("self", "prompt_ids", "images", "multimodal_fields", "num_generations",
                              "has_tool_images"),
    "_generate_and_score_completions": ("self", "inputs"),
    "_calculate_rewards": ("self", "inputs", "prompts", "completions", "completion_ids_list"),
    "_compute_loss": ("self", "model", "inputs"),
    # returns (logps, entropies, aux_loss)
    "_get_per_token_logps_and_entropies": ("self", "model", "input_ids", "attention_mask", "logits_to_keep",
                                           "batch_size"),
    "_get_output_dir": ("self", "trial"),
    "_save_checkpoint": ("self", "model", "trial"),
    "_load_optimizer_and_scheduler": ("self", "checkpoint"),
    "_load_from_checkpoint": ("self", "resume_from_checkpoint"),
    "_issue_warnings_after_load": ("self", "load_result"),
    "_push_from_checkpoint": ("self", "checkpoint_folder"),
    "_load_rng_state": ("self", "checkpoint"),
}
# Private parameters of public transformers / TRL methods the seam passes (checked like TRL_PRIVATE_METHODS).
TRL_PRIVATE_PARAMETERS = {
    "save_model": ("self", "output_dir", "_internal_call"),
}
# Names the seam imports from TRL submodules although `trl` does not export them (checked by the seam test: they
# exist, and no other module imports from a TRL submodule what `trl` itself does not export).
TRL_SUBMODULE_IMPORTS = {
    "trl.chat_template_utils": ("parse_response",),
    "trl.data_utils": ("is_conversational",),
    "trl.models": ("prepare_deepspeed",),
    "trl.models.utils": ("disable_gradient_checkpointing",),
    "trl.trainer.utils": ("get_config_model_id", "pad"),
}
# Trainer state (attributes TRL / transformers set on the trainer) that code outside the seam may read directly,
# besides Trainer's documented "Important attributes" and the constructor arguments kept under their own name: why
# each is safe. Any other state TRL sets is read through an accessor of MethodTrainer (`outcome_reward_weights`,
# `eos_ids`, `masks_truncated_completions`, ...). Checked by tests/trainers/test_trl_seam.py.
DOCUMENTED_TRAINER_STATE = {
    "state": "the TrainerState every TrainerCallback receives (transformers' callback API)",
    "control": "the TrainerControl every TrainerCallback receives (transformers' callback API)",
    "accelerator": "transformers' Accelerate integration (process index, gather, device); documented in its guides",
    "callback_handler": "holds the callbacks that Trainer.add_callback / pop_callback / remove_callback edit",
    "num_generations": "GRPO's group size G, `args.num_generations` as given (the seam test checks they are equal)",
}
TRL_PRIVATE_ATTRIBUTES = ("_tokenizer", "_is_vlm", "_logs", "_metrics", "_pending_metrics", "_pending_extra_logs")
# `vllm_generation` (only with use_vllm): its `max_completion_length`, `llm` (colocate) and `vllm_client` (server).
VLLM_GENERATION_ATTRIBUTES = ("max_completion_length", "llm", "vllm_client")
COMPLETION_STATISTICS = ("completions/mean_length", "completions/min_length", "completions/max_length",
                         "completions/clipped_ratio", "completions/mean_terminated_length",
                         "completions/min_terminated_length", "completions/max_terminated_length")

