"""The pinned CPU kernels (`ppm_trl.demo.kernels`): a warm start has one digest whatever kernels the CPU or the
caller would pick, and the entry points re-execute themselves with the pin."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from ppm_trl.demo import kernels

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                reason="the kernels are pinned on x86-64 CPUs only")

TINY = {"horizons": [1, 2], "num_examples": 64, "max_steps": 5, "batch_size": 8, "hidden_size": 32,
        "num_hidden_layers": 1}
# Builds `TINY` into argv[1] with `warm_start` (pinned: in a child process unless this one is pinned) or, with
# argv[2] == "unpinned", with `build_warm_start` in this process as it is; prints the manifest.
BUILD = """
import json, os, sys
from ppm_trl.demo.warmstart import WarmStartSettings, build_warm_start, read_manifest, warm_start
settings = WarmStartSettings(**json.loads(os.environ["TINY"]))
if sys.argv[2] == "unpinned":
    path = os.path.join(sys.argv[1], "unpinned")
    build_warm_start(settings, path, progress=False)
else:
    path = warm_start(settings, cache_root=sys.argv[1], progress=False)
print("MANIFEST " + json.dumps(read_manifest(path)))
"""


def _levels() -> list[str]:
    """The ATen dispatch levels this CPU can run, lowest first (torch caps a higher request at what it has)."""
    native = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                            capture_output=True, text=True, check=True, env=_ambient(None)).stdout.strip()
    return ["default", "avx2", "avx512"][: {"DEFAULT": 1, "AVX2": 2, "AVX512": 3}.get(native, 1)]


def _ambient(level: str | None) -> dict[str, str]:
    """This environment as a user's machine would have it: no pin, ATen at `level` (None: what the CPU has)."""
    env = {k: v for k, v in os.environ.items() if k not in (*kernels.PINNED_KERNELS, "PPM_TRL_KERNELS_REEXECUTED")}
    if level is not None:
        env["ATEN_CPU_CAPABILITY"] = level
    return {**env, "TINY": json.dumps(TINY), "OMP_NUM_THREADS": "1"}


def _build(tmp_path, level: str, mode: str) -> dict:
    out = tmp_path / f"{mode}_{level}"
    done = subprocess.run([sys.executable, "-c", BUILD, str(out), mode], capture_output=True, text=True,
                          env=_ambient(level), timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.split("MANIFEST ", 1)[1])


def test_pinned_environ_overrides_what_the_caller_set():
    base = {"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AUTO", "HOME": "/h"}
    assert kernels.pinned_environ(base) == {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE,STRICT",
                                            "HOME": "/h"}
    assert base["MKL_CBWR"] == "AUTO"  # not modified


def test_an_entry_point_reexecutes_itself_with_the_pinned_kernels_and_its_arguments():
    code = ("import sys; from ppm_trl.demo.kernels import kernels_in_use, kernels_pinned, pin_kernels; pin_kernels(); "
            "print('RESULT', kernels_in_use(), kernels_pinned(), sys.argv[1:])")
    done = subprocess.run([sys.executable, "-c", code, "--flag", "a b"], capture_output=True, text=True,
                          env=_ambient(_levels()[-1]), timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("RESULT") == 1  # the code before the re-execution printed nothing
    assert ("RESULT {'aten': 'DEFAULT', 'mkl_cbwr': 'COMPATIBLE,STRICT'} True ['--flag', 'a b']"
            in done.stdout), done.stdout


def test_an_unpinned_process_is_not_pinned():
    code = "from ppm_trl.demo.kernels import kernels_pinned; print('RESULT', kernels_pinned())"
    env = {**_ambient(None), "MKL_CBWR": "COMPATIBLE,STRICT"}  # half the pin is no pin
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert "RESULT False" in done.stdout, done.stdout + done.stderr


@pytest.mark.slow
def test_a_warm_start_has_one_digest_under_every_dispatch_level(tmp_path):
    """`warm_start` called where ATen would use its default, AVX2 or AVX-512 kernels (as many as this CPU has)
    builds the same weights; built as it is under the lowest and the highest level (no pin), they differ, so the
    pin is what makes them agree."""
    levels = _levels()
    if len(levels) < 2:
        pytest.skip("this CPU has one ATen dispatch level only")
    pinned = {level: _build(tmp_path, level, "pinned") for level in levels}
    assert {m["weights_digest"] for m in pinned.values()} == {pinned[levels[0]]["weights_digest"]}, pinned
    assert all(m["kernels"] == {"aten": "DEFAULT", "mkl_cbwr": "COMPATIBLE,STRICT"} for m in pinned.values())
    assert all(m["cpu"] == kernels.cpu_model() for m in pinned.values())  # the manifest says which CPU built it
    unpinned = {level: _build(tmp_path, level, "unpinned") for level in (levels[0], levels[-1])}
    assert unpinned[levels[0]]["kernels"]["aten"] == "DEFAULT" and unpinned[levels[-1]]["kernels"]["aten"] != "DEFAULT"
    assert unpinned[levels[0]]["weights_digest"] != unpinned[levels[-1]]["weights_digest"], unpinned


def test_cpu_model_names_the_vendor_and_model_of_the_first_cpu():
    """Run files and warm-start manifests record the CPU: under the pin a result can still depend on its vendor
    (MKL's sqrt, BENCHMARKS.md "On another CPU")."""
    two_cpus = ("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9B14\nflags\t\t: fpu sse2\n\n"
                "processor\t: 1\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\n")
    assert kernels.cpu_model(two_cpus) == "AuthenticAMD: AMD EPYC 9B14"
    assert kernels.cpu_model("processor\t: 0\nmodel name\t: Some CPU\n") == "Some CPU"  # no vendor_id line
    assert kernels.cpu_model("") == (platform.processor() or platform.machine())
    if os.path.exists("/proc/cpuinfo"):
        assert kernels.cpu_model().split(": ")[0] in open("/proc/cpuinfo").read()
