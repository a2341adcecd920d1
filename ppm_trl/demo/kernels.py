"""One choice of CPU kernels for every number the demo and the benchmarks report, whatever x86-64 CPU runs them.

torch picks its vectorised kernels (ATen) by the CPU's instruction set, and MKL picks its GEMM and vector-math code
paths by the instruction set *and the vendor*; each sums and rounds floats in its own way, and after a thousand SFT
steps of a tiny model the difference is another checkpoint (an AVX-512 Xeon built the demo's warm start with another
digest than the AMD machine the reference numbers come from). `PINNED_KERNELS` fixes both at the level every x86-64
CPU has: ATen's baseline (`default`, SSE2) kernels and MKL's `COMPATIBLE` branch of Conditional Numerical
Reproducibility, STRICT (results independent of memory alignment). Measured (`benchmarks/kernel_pinning.py`,
BENCHMARKS.md "Numbers across x86-64 CPUs"): one digest natively at every ATen level of an AVX-512 AMD CPU and
under emulated Intel (Nehalem, Haswell) and AMD (EPYC) CPUs, where their own kernels gave five different ones. The
cost is time: an SFT step of a warm start takes 2.15x as long, an RL step 1.56x. ATen's AVX2 kernels with MKL's
AVX2 branch do not hold across vendors (an emulated Intel CPU built another digest than native and emulated AMD ones)
and crash a CPU without AVX2.

What the pin does not cover: MKL's vector-math `sqrt`, `acos` and `atan` (which `torch.sqrt` and `pow(x, 0.5)` use
on CPU) differ between a real Intel Xeon and any emulated CPU in the `COMPATIBLE` branch too, so they rest on an
instruction whose low bits are the CPU's own; a GRPO run, whose group std goes through `torch.sqrt`, differed
between an Intel and an AMD CPU within its first ten steps (BENCHMARKS.md "On another CPU"). Warm starts (fused
AdamW, RMSNorm's `rsqrt`) kept one digest on both; run files and manifests record `cpu_model()`.

Both settings are read once per process (ATen's at its first dispatched kernel, MKL's at its first call), so they
must be in the environment before torch computes anything: command-line entry points re-execute themselves with
them (`pin_kernels`), and `warm_start` builds in a pinned child process when called from an unpinned one.
"""

from __future__ import annotations

import os
import platform
import sys

PINNED_KERNELS = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE,STRICT"}
_REEXECUTED = "PPM_TRL_KERNELS_REEXECUTED"  # set in the re-executed process: never re-execute twice


def cpu_supports_pinned_kernels() -> bool:
    """Whether the pin means anything here: an x86-64 CPU (other CPUs have neither these kernels nor MKL)."""
    return platform.machine().lower() in ("x86_64", "amd64")


def kernels_in_use() -> dict[str, str | None]:
    """The kernel choice of this process: ATen's capability (as torch reports it) and MKL's CNR branch."""
    import torch

    return {"aten": torch.backends.cpu.get_cpu_capability(), "mkl_cbwr": os.environ.get("MKL_CBWR")}


def cpu_model(cpuinfo: str | None = None) -> str:
    """"<vendor_id>: <model name>" of this machine's first CPU (`/proc/cpuinfo`; `platform.processor()` elsewhere).
    Run files record it: under the pin a number can still depend on the CPU (module docstring)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as handle:
                cpuinfo = handle.read()
        except OSError:
            return platform.processor() or platform.machine()
    fields = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    vendor, model = fields.get("vendor_id", ""), fields.get("model name", "")
    return ": ".join(part for part in (vendor, model) if part) or platform.processor() or platform.machine()


def kernels_pinned() -> bool:
    """Whether this process computes with `PINNED_KERNELS` (settings present before torch chose its kernels)."""
    if any(os.environ.get(name) != value for name, value in PINNED_KERNELS.items()):
        return False
    return kernels_in_use()["aten"] == PINNED_KERNELS["ATEN_CPU_CAPABILITY"].upper()


def pinned_environ(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with `PINNED_KERNELS` on top."""
    return {**(os.environ if base is None else base), **PINNED_KERNELS}


def pin_kernels() -> None:
    """Re-execute this program (same interpreter, same command line) with `PINNED_KERNELS`, unless it already runs
    with them or the CPU is not x86-64. Call it first thing in a command-line entry point, never inside a library
    call (it replaces the process)."""
    if kernels_pinned():
        return
    if os.environ.get(_REEXECUTED):
        print(f"ppm_trl: warning: re-executed with {PINNED_KERNELS} but torch reports {kernels_in_use()}; numbers "
              "may differ from other machines'", file=sys.stderr, flush=True)
        return
    if not cpu_supports_pinned_kernels():
        print(f"ppm_trl: note: kernels are pinned on x86-64 CPUs only, this is {platform.machine()}: its numbers "
              "(and warm-start fingerprints) differ from the reference machine's", file=sys.stderr, flush=True)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**pinned_environ(), _REEXECUTED: "1"})


__all__ = ["PINNED_KERNELS", "cpu_model", "cpu_supports_pinned_kernels", "kernels_in_use", "kernels_pinned",
           "pin_kernels", "pinned_environ"]
