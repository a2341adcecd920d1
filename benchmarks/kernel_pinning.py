"""Does a warm start come out the same on every x86-64 CPU, and what does the kernel pin cost? (issue 40, item 0)

    python benchmarks/kernel_pinning.py --parts identity    # benchmarks/results/kernel_pinning.json; ~15 min, 1 core
    python benchmarks/kernel_pinning.py --parts ops         # elementwise ops under the pin, per CPU (~2 min)
    python benchmarks/kernel_pinning.py --parts cost        # on otherwise idle cores (timings)
    python benchmarks/kernel_pinning.py --quick             # smoke (CI): tiny build, native, two ATen levels, no timing

**Identity.** One short SFT build (`--steps` steps of a tiny model, or `--size recipe`: the recipe's) in a fresh process
for each CPU and kernel choice: natively at every ATen dispatch level this CPU has (default, AVX2, AVX-512), as
torch and MKL choose them and with `ppm_trl.demo.kernels.PINNED_KERNELS`; and, where `qemu-x86_64` is installed
(Debian's `qemu-user`), under emulated CPUs of the other vendor and older instruction sets (`--emulate`), as the
CPU chooses them, pinned, and with the AVX2-level pin that `kernels` rejected (ATen's AVX2 kernels, MKL's AVX2 branch).
The weights digest of each build is reported: a choice holds where all its rows have one digest. (qemu does not
emulate AVX-512, and its reciprocal-square-root estimates are exact where hardware's are approximate: the emulated
rows stand for other CPUs as far as the kernels they pick.)

**Ops.** Under the pin, natively and under each emulated CPU: a digest of what each of a list of elementwise ops
returns on one fixed input, and how many of `torch.sqrt`'s results are not IEEE square roots (numpy's). An op whose
digest differs between CPUs is one the pin does not make CPU-independent (MKL's vector-math sqrt, acos, atan).

**Cost.** Natively, alternating (`--repeats` each): the SFT seconds per step of a warm-start build, and the seconds
of a short RL run (`--rl-steps` steps of line-segment PPM at n = `--rl-n` with its evaluations) from one fixed
checkpoint, pinned against the CPU's own kernels. Ratios in one run, on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from common import RESULTS, markdown_table

from ppm_trl.demo.kernels import PINNED_KERNELS

# A build of `settings` into argv[1] in this process, as its environment pins (or not) the kernels; prints the
# manifest and the training seconds per step.
BUILD = """
import json, os, sys, time
from ppm_trl.demo.warmstart import WarmStartSettings, build_warm_start, read_manifest
settings = WarmStartSettings(**json.loads(sys.argv[2]))
start = time.time()
build_warm_start(settings, sys.argv[1], progress=False)
print("RESULT " + json.dumps({**read_manifest(sys.argv[1]), "seconds": time.time() - start}))
"""
# One RL run from the checkpoint argv[1] (spec argv[2]); prints its seconds and first/last evaluation.
RL = """
import json, sys, tempfile
from ppm_trl.demo import RunSpec, train_variant
from ppm_trl.demo.kernels import kernels_in_use
from ppm_trl.envs import make_dataset
spec = RunSpec(**json.loads(sys.argv[2]))
with tempfile.TemporaryDirectory() as scratch:
    result = train_variant(sys.argv[1], spec, make_dataset("multi_add", spec.n, int(sys.argv[3]), seed=90_000 + spec.n),
                           scratch, progress=False)
print("RESULT " + json.dumps({"train_seconds": result["train_seconds"], "kernels": kernels_in_use(),
                              "last": result["history"][-1]["all_correct"]}))
"""
# Elementwise ops on one fixed input under this process's kernels: a digest per op, and how many of torch.sqrt's
# results are not the IEEE square root (numpy's); `group_std`: the square roots of the exact variances of G = 8 0/1
# rewards (TRL computes its variances in float32 from the rewards, so its sqrt inputs need not be these).
OPS = """
import hashlib, json, numpy, torch
NAMES = ["sqrt", "rsqrt", "exp", "log", "log1p", "expm1", "tanh", "sigmoid", "erf", "sin", "cos", "tan", "acos",
         "asin", "atan", "log2", "log10", "reciprocal"]
torch.manual_seed(0)
x = torch.rand(4096) * 0.9 + 0.05
outputs = {name: getattr(torch, name)(x) for name in NAMES}
outputs.update(pow_half=x.pow(0.5), softmax=torch.softmax(x.view(64, 64), -1), std=x.view(64, 64).std(1),
               group_std=torch.sqrt(torch.tensor([k * (8 - k) / 56 for k in range(1, 8)])))
digest = {name: hashlib.sha256(y.numpy().tobytes()).hexdigest()[:16] for name, y in outputs.items()}
not_ieee = int((outputs["sqrt"].numpy() != numpy.sqrt(x.numpy())).sum())
print("RESULT " + json.dumps({"digests": digest, "sqrt_not_ieee": not_ieee, "inputs": x.numel()}))
"""
LEVELS = ["default", "avx2", "avx512"]
NO_AVX2 = {"Nehalem", "Westmere", "SandyBridge", "IvyBridge", "qemu64", "Opteron_G3"}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="SFT steps of each identity build.")
    parser.add_argument("--size", choices=["tiny", "recipe"], default="tiny",
                        help="Identity builds of a tiny model (hidden 32, 1 layer, batch 8: an emulated build takes "
                             "~1.5 min of one core) or of the recipe's (hidden 128, 2 layers, batch 32: over 8 min).")
    parser.add_argument("--emulate", nargs="*", default=["Haswell", "EPYC", "Nehalem"],
                        help="qemu CPU models for emulated builds (skipped without qemu-x86_64).")
    parser.add_argument("--cost-sft-steps", type=int, default=100)
    parser.add_argument("--rl-steps", type=int, default=10)
    parser.add_argument("--rl-n", type=int, default=6)
    parser.add_argument("--rl-eval-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2, help="Timed runs per kernel choice (alternating).")
    parser.add_argument("--json", default=None, help="Default: benchmarks/results/kernel_pinning.json (--quick: a "
                        "temporary file).")
    parser.add_argument("--parts", nargs="+", choices=["identity", "ops", "cost"], default=["identity", "ops", "cost"],
                        help="What to measure; a part not run keeps what --json already holds for it.")
    parser.add_argument("--quick", action="store_true",
                        help="Smoke: a tiny build, native only (two ATen levels), no timing.")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.size, args.emulate, args.parts = 2, "tiny", [], ["identity"]
    if args.json is None:
        args.json = os.path.join(tempfile.gettempdir() if args.quick else RESULTS, "kernel_pinning.json")
    return args


# The kernel choices compared: the CPU's own, the pin, and the rejected pin at the AVX2 level.
CHOICES = {"own": {}, "pinned": PINNED_KERNELS, "avx2_level": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT"}}


def environment(level: str | None, choice: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (*PINNED_KERNELS, "PPM_TRL_KERNELS_REEXECUTED")}
    if level is not None:
        env["ATEN_CPU_CAPABILITY"] = level
    return {**env, **CHOICES[choice], "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def run_child(code: str, args: list[str], env: dict[str, str], emulate: str | None = None) -> dict:
    prefix = ["qemu-x86_64", "-cpu", emulate] if emulate else []
    done = subprocess.run([*prefix, sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          timeout=6 * 3600)
    if done.returncode != 0 or "RESULT " not in done.stdout:
        raise SystemExit(f"child failed ({emulate or 'native'}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])


def build(settings: dict, env: dict[str, str], emulate: str | None = None) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        return run_child(BUILD, [os.path.join(scratch, "model"), json.dumps(settings)], env, emulate)


def native_levels() -> list[str]:
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                          capture_output=True, text=True, env=environment(None, "own"), check=True)
    return LEVELS[: {"DEFAULT": 1, "AVX2": 2, "AVX512": 3}.get(done.stdout.strip(), 1)]


def identity(args) -> list[dict]:
    from ppm_trl.demo.warmstart import WarmStartSettings

    settings = {**json.loads(json.dumps(WarmStartSettings().__dict__)), "max_steps": args.steps,
                "num_examples": 32 * args.steps}
    if args.size == "tiny":
        settings.update(horizons=[1, 2], batch_size=8, hidden_size=32, num_hidden_layers=1, num_examples=64)
    rows = []

    def add(cpu: str, level: str | None, choice: str, emulate: str | None = None) -> None:
        rows.append({"cpu": cpu, "requested_aten": level, "choice": choice,
                     **slim(build(settings, environment(level, choice), emulate))})
        print(f"  {rows[-1]}", flush=True)

    levels = native_levels()
    if args.quick:  # the pin's claim needs two levels: the lowest and the CPU's highest
        levels = list(dict.fromkeys([levels[0], levels[-1]]))
    for level in levels:
        for choice in ("own", "pinned"):
            add("native", level, choice)
    if "avx2" in levels and not args.quick:
        add("native", None, "avx2_level")
    if args.emulate and shutil.which("qemu-x86_64") is None:
        print("  qemu-x86_64 not found (apt-get install qemu-user): no emulated CPUs", flush=True)
        args.emulate = []
    for cpu in args.emulate:
        for choice in ("own", "pinned", "avx2_level"):
            if choice == "avx2_level" and cpu in NO_AVX2:
                continue  # ATen's AVX2 kernels on a CPU without AVX2: an illegal instruction
            add(f"qemu {cpu}", None, choice, emulate=cpu)
    return rows


def ops(args) -> dict:
    """The OPS digests under the pin, natively and under each emulated CPU, and the ops whose digests differ."""
    cpus = [("native", None)] + [(f"qemu {cpu}", cpu) for cpu in args.emulate if shutil.which("qemu-x86_64")]
    rows = {name: run_child(OPS, [], environment(None, "pinned"), emulate) for name, emulate in cpus}
    names = next(iter(rows.values()))["digests"]
    differ = sorted(op for op in names if len({row["digests"][op] for row in rows.values()}) > 1)
    # Natively with only MKL's branch changed: the ops whose digests move are MKL's, not ATen's.
    mkl_avx2 = run_child(OPS, [], {**environment(None, "pinned"), "MKL_CBWR": "AVX2,STRICT"})
    mkl_ops = sorted(op for op in names if mkl_avx2["digests"][op] != rows["native"]["digests"][op])
    for name, row in rows.items():
        print(f"  {name}: torch.sqrt not IEEE on {row['sqrt_not_ieee']} of {row['inputs']}", flush=True)
    print(f"  ops whose results differ between these CPUs under the pin: {differ or 'none'}", flush=True)
    print(f"  natively with MKL_CBWR=AVX2,STRICT instead: {mkl_ops} change (MKL's), torch.sqrt not IEEE on "
          f"{mkl_avx2['sqrt_not_ieee']}", flush=True)
    return {"by_cpu": rows, "differ_across_cpus": differ, "native_mkl_avx2_branch": mkl_avx2, "mkl_ops": mkl_ops}


def slim(manifest: dict) -> dict:
    return {"aten": manifest["kernels"]["aten"], "mkl_cbwr": manifest["kernels"]["mkl_cbwr"],
            "digest": manifest["weights_digest"], "seconds": round(manifest["seconds"], 1)}


def cost(args, checkpoint: str) -> dict:
    from ppm_trl.demo.warmstart import WarmStartSettings

    sft = {**json.loads(json.dumps(WarmStartSettings().__dict__)), "max_steps": args.cost_sft_steps,
           "num_examples": 32 * args.cost_sft_steps}
    spec = {"variant": "lines", "n": args.rl_n, "learning_rate": 1e-4, "max_steps": args.rl_steps,
            "eval_every": args.rl_steps, "seed": 0}
    timings = {"sft": {False: [], True: []}, "rl": {False: [], True: []}}
    for _ in range(args.repeats):
        for pinned in (False, True):
            env = environment(None, "pinned" if pinned else "own")
            timings["sft"][pinned].append(build(sft, env)["seconds"] / args.cost_sft_steps)
            rl = run_child(RL, [checkpoint, json.dumps(spec), str(args.rl_eval_size)], env)
            timings["rl"][pinned].append(rl["train_seconds"] / args.rl_steps)
            print(f"  pinned={pinned}: SFT {timings['sft'][pinned][-1]:.3f} s/step, RL "
                  f"{timings['rl'][pinned][-1]:.2f} s/step", flush=True)
    out = {}
    for part in ("sft", "rl"):
        own, pinned = statistics.median(timings[part][False]), statistics.median(timings[part][True])
        out[part] = {"own_kernels_s_per_step": own, "pinned_s_per_step": pinned, "ratio": pinned / own,
                     "runs": {str(k): v for k, v in timings[part].items()}}
    out["settings"] = {"sft_steps": args.cost_sft_steps, "rl": spec, "rl_eval_size": args.rl_eval_size,
                       "checkpoint": checkpoint}
    return out


def main(argv=None) -> dict:
    args = parse_args(argv)
    results = {}
    if os.path.exists(args.json):
        with open(args.json) as handle:
            results = json.load(handle)
    results["pinned_kernels"], results["choices"] = PINNED_KERNELS, CHOICES
    if "identity" in args.parts:
        print("identity: one short build per CPU and kernel choice", flush=True)
        rows = identity(args)
        results.update(identity=rows, settings={"steps": args.steps, "size": args.size, "emulate": args.emulate},
                       digests_by_choice={choice: sorted({r["digest"] for r in rows if r["choice"] == choice})
                                          for choice in CHOICES})
        results["pinned_digests"] = results["digests_by_choice"]["pinned"]
    if "ops" in args.parts:
        print("ops: elementwise ops under the pin, per CPU", flush=True)
        results["ops"] = ops(args)
    if "cost" in args.parts:
        from ppm_trl.demo.warmstart import WarmStartSettings, warm_start

        print("cost: pinned against the CPU's own kernels, alternating", flush=True)
        results["cost"] = cost(args, warm_start(WarmStartSettings(), progress=False))
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as handle:
        json.dump(results, handle, indent=2)
    rows = results.get("identity", [])
    print(markdown_table(["CPU", "ATen asked", "kernels", "ATen used", "MKL_CBWR", "digest", "build s"],
                         [[r["cpu"], r["requested_aten"] or "(CPU's)", r["choice"], r["aten"], r["mkl_cbwr"] or "–",
                           r["digest"], f"{r['seconds']:.0f}"] for r in rows]))
    for choice, found in results.get("digests_by_choice", {}).items():
        if found:
            print(f"{choice} builds: {len(found)} digest(s) {found}")
    for part in ("sft", "rl") if "cost" in results else ():
        c = results["cost"][part]
        print(f"{part}: {c['own_kernels_s_per_step']:.3f} → {c['pinned_s_per_step']:.3f} s/step pinned "
              f"({c['ratio']:.2f}x)")
    return results


if __name__ == "__main__":
    main()
