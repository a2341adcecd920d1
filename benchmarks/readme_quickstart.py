"""The README's Python Quickstart as written (read from README.md and executed, as tests/cli/test_readme.py does), all of
its steps, with TRL's logging windows and the wall time written out.

    python benchmarks/readme_quickstart.py --json benchmarks/results/quickstart_pinned.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from common import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests"))
from test_readme import readme_block  # noqa: E402

KEYS = ("step", "reward", "ppm/final_progress", "ppm/frac_groups_nonzero_advantage", "step_time")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    code = readme_block("Quickstart (Python)", "python")
    start, namespace = time.time(), {}
    with tempfile.TemporaryDirectory() as scratch:
        os.chdir(scratch)  # the block writes `out/`
        exec(compile(code, "README.md", "exec"), namespace)
    windows = [{key: entry.get(key) for key in KEYS} for entry in namespace["trainer"].state.log_history
               if "reward" in entry]
    result = {"windows": windows, "wall_seconds": time.time() - start,
              "load_average": os.getloadavg(), "code": code}
    with open(args.json, "w") as handle:
        json.dump(result, handle, indent=2)
    for window in windows:
        print(window)
    print(f"{result['wall_seconds']:.0f} s")
    return result


if __name__ == "__main__":
    main()
