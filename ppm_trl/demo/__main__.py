"""`python -m ppm_trl.demo [flags]` (what `make demo` runs), re-executed with the pinned kernels first."""

from ppm_trl.demo.kernels import pin_kernels

pin_kernels()

import sys  # noqa: E402

from ppm_trl.demo.pipeline import main  # noqa: E402

try:
    main()
except KeyboardInterrupt as interrupted:  # one line, not a traceback: the warm start leaves nothing half-built
    print(f"\nppm_trl.demo: stopped by Ctrl-C{': ' + str(interrupted) if str(interrupted) else ''}", file=sys.stderr)
    sys.exit(130)
