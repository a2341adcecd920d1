"""`ppm-trl train | eval | prepare | estimate`: the entry point. Each subcommand is a module of its own —
`train.py`, `evaluate.py`, `prepare/`, `estimate/` — over the shared `flags.py` (YAML, flags, `UsageError`) and
`data.py` (loading and checking the data); this module only dispatches and turns errors into one line and an exit
status. The names below stay importable from here (`ppm_trl.cli.TrainScriptArguments`, `parse_train_args`, ...).
"""

from __future__ import annotations

import os
import sys

from .data import (  # noqa: F401  (importable from here as before)
    check_data_file,
    check_model_source,
    load_hub_dataset,
    load_train_dataset,
    looks_local,
    prepare_dataset,
    unfinished_prepare,
)
from .evaluate import (  # noqa: F401
    DEFAULT_EVAL_MAX_NEW_TOKENS,
    EVAL_RENAMED,
    EvalArguments,
    evaluate,
    parse_eval_args,
)
from .flags import (  # noqa: F401
    JUDGE_BUDGET_EXIT_CODE,
    UsageError,
    check_config_keys,
    check_config_values,
    check_flags,
    read_yaml_config,
)
from .methods import METHODS
from .report import method_metrics_mean, nothing_learned, training_summary  # noqa: F401
from .train import (  # noqa: F401
    TRAIN_RENAMED,
    TrainScriptArguments,
    auto_bf16,
    build_reward_funcs,
    build_trainer,
    check_prompt_lengths,
    eval_command,
    fit_generation_batch,
    in_flag_spelling,
    log_last_step_callback,
    parse_train_args,
    report_done,
    resolve_model,
    reward_names,
    run_example,
    run_training,
    stopped_early,
    train,
    train_fields,
)

USAGE = ("usage: ppm-trl {train,eval,prepare,estimate} ... [--debug]\n"
         f"  train    --config FILE.yaml [--key value ...]  (method: {'|'.join(METHODS)})\n"
         "  eval     --model DIR --env NAME | --dataset_name ID  (pass@k, avg@n)\n"
         "  prepare  --dataset ID --reference-column COL --judge-model M --out DIR  (answer, reference, points, graph)\n"
         "  estimate [prepare] <train's or prepare's flags> [--calibrate N] [--json F]  (judge requests, tokens, "
         "cost, time)\n"
         "  --debug  show the Python traceback of an error")


def main(argv: list[str] | None = None) -> None:
    """Dispatch; a user error prints one `ppm-trl <command>: error: ...` line and exits 2, a judge that cannot be
    used (auth, connection, too many unscorable answers) exits 1; `--debug` re-raises with the traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    commands = ("train", "eval", "prepare", "estimate")
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        print(USAGE)
        raise SystemExit(0 if argv and argv[0] in ("-h", "--help") else 2)
    command, rest = argv[0], argv[1:]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from .judge import JudgeConfigurationError, callback

    # A judge that cannot judge is a runtime failure (exit 1), not a usage error.
    runtime_errors = (JudgeConfigurationError, *([callback.JudgeUnscorableError]
                                                 if hasattr(callback, "JudgeUnscorableError") else []))
    try:
        if command == "train":
            train(rest)
        elif command == "eval":
            evaluate(rest)
        elif command == "estimate":
            from .estimate import main as estimate_main

            estimate_main(rest)
        else:
            from .prepare import main as prepare_main

            prepare_main(rest)
    except SystemExit as exit_:
        if debug or not isinstance(exit_.code, str):  # argparse's own usage errors are already printed
            raise
        _fail(command, exit_.code, 2)
    except KeyboardInterrupt:  # Ctrl-C before training started (`train` itself saves and exits 130)
        if debug:
            raise
        print(f"\nppm-trl {command}: interrupted (Ctrl-C) before any step was trained; nothing was saved",
              file=sys.stderr)
        raise SystemExit(130) from None
    except runtime_errors as error:
        if debug:
            raise
        _fail(command, in_flag_spelling(str(error), rest if command == "train" else None), 1)
    except ValueError as error:  # our checks (columns, configs, data files, trainers) raise ValueError / UsageError
        if debug:
            raise
        _fail(command, in_flag_spelling(str(error), rest if command == "train" else None), 2)


def _fail(command: str, message: str, code: int) -> None:
    prefix = f"ppm-trl {command}: "
    message = message[len(prefix):] if message.startswith(prefix) else message
    print(f"{prefix}error: {message}\n(rerun with --debug for the traceback)", file=sys.stderr)
    raise SystemExit(code)


if __name__ == "__main__":
    main()
