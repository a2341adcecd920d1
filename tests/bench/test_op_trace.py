"""The CPU-difference tools of issue 40 item 0: `benchmarks/op_trace.py` finds the op where two traces part, and
`kernel_pinning.py --parts ops` digests elementwise ops under the pin."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _benchmarks_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))


def test_compare_reports_the_op_whose_inputs_agree_and_outputs_differ(tmp_path):
    from op_trace import compare

    native = ["aten.mm.default in=aa out=bb", "aten.sqrt.default in=cc out=dd", "aten.div.Tensor in=dd out=ee"]
    other = ["aten.mm.default in=aa out=bb", "aten.sqrt.default in=cc out=d2", "aten.div.Tensor in=d2 out=e2"]
    (tmp_path / "a.txt").write_text("\n".join(native))
    (tmp_path / "b.txt").write_text("\n".join(other))
    report = compare(str(tmp_path / "a.txt"), str(tmp_path / "b.txt"), str(tmp_path / "r.json"))
    # The div differs only because its input did: the sqrt is where the CPUs part.
    assert report["first_difference"] == 1
    assert report["same_inputs_other_outputs"] == [{"index": 1, "op": "aten.sqrt.default"}]
    assert (tmp_path / "r.json").exists()
    (tmp_path / "c.txt").write_text("\n".join(native))
    assert compare(str(tmp_path / "a.txt"), str(tmp_path / "c.txt"), None)["first_difference"] is None


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="the pin is x86-64's")
def test_ops_part_digests_every_op_under_the_pin():
    import kernel_pinning

    args = kernel_pinning.parse_args(["--parts", "ops", "--emulate"])
    out = kernel_pinning.ops(args)
    native = out["by_cpu"]["native"]
    assert {"sqrt", "acos", "atan", "exp", "pow_half", "group_std"} <= set(native["digests"])
    assert 0 <= native["sqrt_not_ieee"] <= native["inputs"] == 4096
    assert out["differ_across_cpus"] == []  # one CPU: nothing to differ from
    # torch.sqrt is MKL's vector math: switching MKL's branch alone moves it (where the CPU has that branch: AVX2)
    if "avx2" in open("/proc/cpuinfo").read():
        assert "sqrt" in out["mkl_ops"] and set(out["mkl_ops"]) <= set(native["digests"])
