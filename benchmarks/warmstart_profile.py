"""Where a warm start's errors sit: sampled all-correct and per-sub-problem accuracy per horizon, and the accuracy of
each line position (the table above each horizon-scaling result in BENCHMARKS.md).

    python benchmarks/warmstart_profile.py --env chain_add --horizons 2 3 4 5 6 7 8 10 --lines-at 6 8 \
        --json benchmarks/results/horizon_scaling/chain_add/warmstart_profile.json
    python benchmarks/warmstart_profile.py --quick      # CI smoke
"""

from __future__ import annotations

import argparse
import json

import common  # noqa: F401  (puts the checkout on sys.path)
from horizon_scaling import ENVS

from ppm_trl.demo import choose_horizons, format_profile, profile_warm_start
from ppm_trl.demo.kernels import pin_kernels
from ppm_trl.demo.warmstart import WarmStartSettings, read_manifest, warm_start


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", choices=ENVS, default="multi_add")
    parser.add_argument("--horizons", type=int, nargs="+", default=[2, 3, 4, 5, 6, 7, 8, 10])
    parser.add_argument("--lines-at", type=int, nargs="*", default=[8], help="Horizons whose line accuracies to print.")
    parser.add_argument("--size", type=int, default=256, help="Prompts per horizon.")
    parser.add_argument("--json", default=None, help="Also write the results to this file.")
    parser.add_argument("--cache-dir", default=None, help="Warm-start cache root.")
    parser.add_argument("--warm-start-steps", type=int, default=None,
                        help="The warm start trained this many SFT steps (default: the recipe's count).")
    parser.add_argument("--quick", action="store_true", help="CI smoke: an untrained tiny warm start, 4 prompts.")
    args = parser.parse_args(argv)
    settings = WarmStartSettings.for_env(args.env)
    if args.warm_start_steps is not None:
        settings = WarmStartSettings.for_env(args.env, max_steps=args.warm_start_steps)
    if args.quick:
        settings = WarmStartSettings(env=args.env, horizons=(1,), num_examples=8, max_steps=1, batch_size=4,
                                     hidden_size=32, num_hidden_layers=1)
        args.horizons, args.lines_at, args.size = [1, 2], [2], 4
    model_path = warm_start(settings, cache_root=args.cache_dir, progress=False)
    rates = profile_warm_start(model_path, args.env, args.horizons, args.size)  # the demo's profile
    chosen, reasons = choose_horizons(rates)
    fingerprint = read_manifest(model_path)["weights_digest"]
    print(f"warm start {fingerprint} ({model_path})\n{format_profile(rates, reasons)}\n→ {chosen}")
    results = [{"n": n, "all_correct": rates[n]["all_correct"], "per_subproblem": rates[n]["per_subproblem"],
                "lines": rates[n]["per_point"]} for n in args.horizons]
    print(f"| n | {' | '.join(str(r['n']) for r in results)} |\n|---|{'---|' * len(results)}")
    for key in ("all_correct", "per_subproblem"):
        print(f"| {key.replace('_', '-')} | {' | '.join(f'{r[key]:.3f}' for r in results)} |")
    for r in results:
        if r["n"] in args.lines_at:
            print(f"n = {r['n']}, line by line: {' '.join(f'{a:.2f}' for a in r['lines'])}")
    report = json.dumps({"warm_start": model_path, "warm_start_fingerprint": fingerprint, "env": args.env,
                         "chosen": chosen, "results": results})
    print(report)
    if args.json:
        with open(args.json, "w") as handle:
            handle.write(report + "\n")
    return results


if __name__ == "__main__":
    pin_kernels()  # re-executes with the pinned kernels (ppm_trl.demo.kernels)
    main()
