"""`ppm-trl train | eval | prepare | estimate`: the entry point. Each subcommand is a module of its own —
`train.py`, `evaluate.py`, `prepare/`, `estimate/` — over the shared `flags.py` (YAML, flags, `UsageError`) and
`data.py` (loading and checking the data); this module only dispatches and turns errors into one line and an exit
status.
"""

from __future__ import annotations

import os
import sys

from .evaluate import (
    evaluate,
)
from .registry import METHODS
from .train import (
    in_flag_spelling,
    train,
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
