"""Third-party output a user can do nothing about, silenced for `ppm-trl train`, the example scripts and the demo.

Each entry is narrow — one message, its category and the module that emits it — so every other warning still shows
(once per place, Python's default). Importing this module is cheap: nothing third-party is imported until
`quiet_third_party()` runs, and the filters are in place before TRL, transformers or DeepSpeed are imported.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings

# (message regex, category, emitting module regex), each with why it is noise.
UNACTIONABLE_WARNINGS = (
    # TRL 1.16's configs default `gradient_checkpointing=True` under its old name, which transformers 5.24 renamed
    # (`activation_checkpointing`): every GRPOConfig warns, whatever the user set.
    (r"`gradient_checkpointing(_kwargs)?` is deprecated", FutureWarning, r"transformers\.training_args"),
    # TRL's `disable_gradient_checkpointing` (around every generation) calls the renamed model methods.
    (r"`(is_gradient_checkpointing|gradient_checkpointing_(enable|disable))` is deprecated", FutureWarning,
     r"transformers\.modeling_utils"),
    # DeepSpeed ZeRO-3's own collectives, renamed in torch 2.13.
    (r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated", FutureWarning,
     r"torch\.distributed\.c10d_logger"),
)

# DeepSpeed logs this at WARNING in every process on a machine without CUDA, where the CPU is the intended device.
DEEPSPEED_CPU_FALLBACK = "Setting accelerator to CPU"


def _not_cpu_fallback(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(DEEPSPEED_CPU_FALLBACK)


def quiet_third_party() -> None:
    """Install the filters above (idempotent); call it first thing in a process, before TRL is imported.

    Also turns off transformers' per-call progress bars ("Loading weights", "Writing model shards": one per load or
    save, and per process under `accelerate launch`), leaving the training bar and the Hub's download bars on; and
    when stderr is not a terminal (a log file), bars redraw every 5 s instead of 10 times a second (tqdm reads
    `TQDM_MININTERVAL`; a value the user set wins, and worker processes inherit it).
    """
    if not sys.stderr.isatty():  # in a file every redraw is a new line's worth of bytes, not an overwrite
        os.environ.setdefault("TQDM_MININTERVAL", "5")
    for message, category, module in UNACTIONABLE_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    # A filter on DeepSpeed's named logger survives DeepSpeed's own setup of that logger at import.
    deepspeed_logger = logging.getLogger("DeepSpeed")
    if _not_cpu_fallback not in deepspeed_logger.filters:
        deepspeed_logger.addFilter(_not_cpu_fallback)
    import huggingface_hub.utils
    import transformers.utils.logging

    downloads_shown = not huggingface_hub.utils.are_progress_bars_disabled()
    transformers.utils.logging.disable_progress_bar()  # also switches the Hub's bars off, so:
    if downloads_shown:
        huggingface_hub.utils.enable_progress_bars()


@contextlib.contextmanager
def datasets_progress_bars_off():
    """No `datasets` progress bars (Map, Filter, ...) inside the block: for the library's own passes over data it
    built itself, which take seconds and would print one bar each."""
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was_disabled = are_progress_bars_disabled()
    disable_progress_bars()
    try:
        yield
    finally:
        if not was_disabled:
            enable_progress_bars()
