"""`python -m ppm_trl.demo [flags]` (what `make demo` runs)."""

from ppm_trl.demo.pipeline import main

main()
