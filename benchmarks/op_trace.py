"""Which aten op makes a run differ between two CPUs? A trace of every op of a short demo run, compared op by op.

    python benchmarks/op_trace.py trace sparse 1 /tmp/native.txt                     # natively (pinned kernels)
    ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE,STRICT \
        qemu-x86_64 -cpu EPYC $(which python) benchmarks/op_trace.py trace sparse 1 /tmp/epyc.txt   # emulated
    python benchmarks/op_trace.py compare /tmp/native.txt /tmp/epyc.txt --json benchmarks/results/op_trace.json

`trace` trains `variant` for `steps` RL steps at n = 2 (seed 0, lr 1e-4, 2 evaluation prompts) from the `multi_add`
warm start under a `TorchDispatchMode` that logs, per aten op, a digest of its inputs and of its outputs. `compare`
reports the ops whose inputs agree and outputs differ: where two CPUs part, under the same kernel pin. (Under qemu
set the pin in the environment: the re-execution that `pin_kernels` does would leave the emulator.)
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path


def trace(variant: str, steps: int, out: str) -> None:
    import torch
    from evidence_protocol import eval_set
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    from ppm_trl.demo import RunSpec, train_variant
    from ppm_trl.demo.kernels import pin_kernels
    from ppm_trl.demo.warmstart import WarmStartSettings, warm_start

    pin_kernels()

    def digest(values) -> str:
        h = hashlib.blake2b(digest_size=8)
        for t in tree_leaves(values):
            if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.device.type == "cpu":
                h.update(str(tuple(t.shape)).encode())
                h.update(t.detach().contiguous().numpy().tobytes())
        return h.hexdigest()

    class Trace(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.lines = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            self.lines.append(f"{func} in={digest((args, kwargs))} out={digest(result)}")
            return result

    model = warm_start(WarmStartSettings(), progress=False)
    spec = RunSpec(variant=variant, n=2, learning_rate=1e-4, max_steps=steps, prompts_per_step=8, num_generations=8,
                   eval_every=1000, seed=0)
    recorder = Trace()
    with tempfile.TemporaryDirectory() as scratch, recorder:
        result = train_variant(model, spec, eval_set("multi_add", 2, "report", 2), scratch, progress=False)
    with open(out, "w") as handle:
        handle.write("\n".join(recorder.lines) + "\n")
    print(f"{len(recorder.lines)} ops; train_loss {result['train_logs'][-1].get('train_loss')!r}")


def compare(first: str, second: str, json_path: str | None) -> dict:
    a, b = (Path(path).read_text().splitlines() for path in (first, second))
    parted = []
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y and x.split(" ")[:2] == y.split(" ")[:2]:  # same op, same inputs, other outputs
            parted.append({"index": index, "op": x.split(" ")[0]})
    first_diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    report = {"traces": [os.path.basename(first), os.path.basename(second)], "ops": [len(a), len(b)],
              "first_difference": first_diff, "same_inputs_other_outputs": parted}
    print(json.dumps(report, indent=2))
    if json_path:
        with open(json_path, "w") as handle:
            json.dump(report, handle, indent=2)
    return report


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if sys.argv[1] == "trace":
        trace(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        compare(sys.argv[2], sys.argv[3], sys.argv[5] if len(sys.argv) > 5 and sys.argv[4] == "--json" else None)
