"""`python -m ppm_trl.demo [flags]` (what `make demo` runs), re-executed with the pinned kernels first."""

from ppm_trl.demo.kernels import pin_kernels

pin_kernels()

from ppm_trl.demo.pipeline import main  # noqa: E402

main()
