"""`python -m ppm_trl.prepare ...`: the same as `ppm-trl prepare ...`."""

import sys

from ppm_trl.prepare import main

main(sys.argv[1:])
