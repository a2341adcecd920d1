"""Theorem 5.1 / App. A of the PPM paper by simulation, with OUR advantage functions (`ppm_trl.advantages`).

Model (App. A): n turns; at turn v the policy attempts point v and succeeds with B_v ~ Bernoulli(p), independent.
A concrete policy makes the score explicit: one Bernoulli action per turn with logit θ_v, so the score projected on
the all-ones direction is x_v = B_v − p (E[x_v] = 0, μ = E[B_v x_v] = p(1 − p) ≠ 0). Point v is reached when
I_v = Π_{j ∈ P_v} B_j:

* independent graph (Multi-Countdown / multi_add): P_v = {v}, I_v = B_v;
* sequential graph (Matrix): P_v = {1..v}, I_v = B_1·…·B_v.

The outcome is I_g = I_1·…·I_n; segment v = turn v (K = n); progress m_k = (1/n)·Σ_{v≤k} I_v; no outcome term.
Two families of estimators, both built from the library's functions:

* the paper's, per sample and without a baseline (eqs. 8-10): Y1 = I_g·Σx_v (outcome), Y2 = (C/n)·Σx_v
  (`ppm_trajectory_rewards`), Y3 = Σ_v (I_v/n)·x_v (`ppm_segment_rewards`);
* the trainers', per group of G with the group-mean baseline: ĝ = (1/G) Σ_i Σ_v A_{i,v} x_{i,v} with A from
  `sparse_outcome_advantages` (scale off, and on as in TRL's GRPO), `ppm_trajectory_advantages`,
  `ppm_segment_advantages`.

SNR = |E ĝ| / sd(ĝ). The paper predicts Y1 = Θ(p^{n/2}), Y2 = Θ(n^{-1/2}), Y3 = Θ(√n) (independent) and Θ(1)
(sequential); the closed forms of App. A (eq. 16-17 for Y1, eq. 66 for Y3) are printed next to the simulation.
The group baseline changes the trajectory estimator's scaling (the centred C − mean C has O(√n) spread, not O(n)):
the table shows by how much.

    python benchmarks/snr.py                 # table + benchmarks/results/snr.{json,png}
    python benchmarks/snr.py --quick         # CI smoke
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ppm_trl.advantages import sparse_outcome_advantages
from ppm_trl.ppm.ppm_estimators import (
    ppm_segment_advantages,
    ppm_segment_rewards,
    ppm_trajectory_advantages,
    ppm_trajectory_rewards,
)

PAPER_ESTIMATORS = ("Y1", "Y2", "Y3")  # per sample, no baseline: exactly App. A eqs. 8-10
GROUP_ESTIMATORS = ("sparse", "sparse+std", "trajectory", "segment")  # per group of G, our advantages
ESTIMATORS = PAPER_ESTIMATORS + GROUP_ESTIMATORS
GRAPHS = ("independent", "sequential")
MIN_SUCCESSES = 50  # below this many outcome successes a sparse SNR estimate is noise: reported as None


def _gradients(graph: str, n: int, p: float, group_size: int, groups: int, generator: torch.Generator):
    """{estimator: (units,) projected gradient estimates}, and the number of outcome successes."""
    rows = groups * group_size
    success = (torch.rand(rows, n, generator=generator, dtype=torch.float64) < p).double()
    score = success - p  # d/dθ log Bernoulli(B; sigmoid θ) = B − p
    reached = success if graph == "independent" else torch.cumprod(success, dim=1)
    outcome = reached.prod(dim=1)
    progress = torch.cumsum(reached, dim=1) / n  # m_k = (1/n)·Σ_{v≤k} I_v
    per_turn = {  # (rows, n) or (rows, 1) weight of each turn's score
        "Y1": outcome.unsqueeze(1),
        "Y2": ppm_trajectory_rewards(progress, add_outcome=False).unsqueeze(1),  # C/n
        "Y3": ppm_segment_rewards(progress, add_outcome=False),  # I_v/n
        "sparse": sparse_outcome_advantages(outcome, group_size, scale=False).unsqueeze(1),
        "sparse+std": sparse_outcome_advantages(outcome, group_size, scale=True).unsqueeze(1),
        "trajectory": ppm_trajectory_advantages(progress, outcome, group_size, add_outcome=False),
        "segment": ppm_segment_advantages(progress, outcome, group_size, add_outcome=False),
    }
    estimates = {}
    for name, weight in per_turn.items():
        per_sample = (weight * score).sum(dim=1)
        estimates[name] = per_sample if name in PAPER_ESTIMATORS else per_sample.view(groups, group_size).mean(dim=1)
    return estimates, int(outcome.sum())


def simulate(graph: str, n: int, p: float, group_size: int, num_groups: int, generator: torch.Generator,
             chunk_groups: int = 4096) -> dict[str, float | None]:
    """Simulated SNR of each estimator for one (graph, n) from `num_groups` groups of G samples.

    Paper estimators (Y1-Y3) are per sample; ours are per group (the unit a GRPO step averages).
    """
    sums = {name: [0.0, 0.0, 0] for name in ESTIMATORS}  # Σ ĝ, Σ ĝ², count
    successes, done = 0, 0
    while done < num_groups:
        groups = min(chunk_groups, num_groups - done)
        estimates, found = _gradients(graph, n, p, group_size, groups, generator)
        for name, values in estimates.items():
            sums[name][0] += float(values.sum())
            sums[name][1] += float((values**2).sum())
            sums[name][2] += values.numel()
        successes += found
        done += groups
    result: dict[str, float | None] = {}
    for name, (total, squares, count) in sums.items():
        mean = total / count
        variance = max(squares / count - mean**2, 0.0)
        snr = abs(mean) / math.sqrt(variance) if variance > 0 else None
        if name in ("Y1", "sparse", "sparse+std") and successes < MIN_SUCCESSES:
            snr = None
        result[name] = snr
    result["outcome_successes"] = successes
    return result


def closed_form(graph: str, n: int, p: float) -> dict[str, float]:
    """App. A closed forms without a baseline, for x_v = B_v − p: SNR(Y_1) (eq. 16-17) and SNR(Y_3) (eq. 66)."""
    mu, lam = p * (1 - p), p * (1 - p) ** 2  # μ = E[B x], λ = E[B x²]
    if graph == "independent":
        mean_c, var_c = n * p, n * p * (1 - p)
    else:  # d_vw = max(v, w): E[C] = Σ p^v, E[C²] = Σ_k (2k − 1) p^k
        mean_c = sum(p**v for v in range(1, n + 1))
        var_c = sum((2 * k - 1) * p**k for k in range(1, n + 1)) - mean_c**2
    kappa = p * lam / mu**2 - 1
    segment = mean_c / math.sqrt(var_c + kappa * mean_c)
    # Y_1 = I_g Σ x_v depends only on the outcome, the same event in both graphs (all n points reached).
    var_y1 = n * lam * p ** (n - 1) + n * (n - 1) * mu**2 * p ** (n - 2) - (n * mu * p ** (n - 1)) ** 2
    sparse = n * mu * p ** (n - 1) / math.sqrt(var_y1)
    return {"sparse_theory": sparse, "segment_theory": segment}


def log_log_slope(ns, values) -> float | None:
    points = [(math.log(n), math.log(v)) for n, v in zip(ns, values) if v]
    if len(points) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def plot(results: dict, path: str, p: float, group_size: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5), sharex=True)
    styles = {"Y1": "o-", "Y2": "^-", "Y3": "D-", "sparse": "o-", "sparse+std": "s--", "trajectory": "^-",
              "segment": "D-"}
    for column, graph in enumerate(GRAPHS):
        rows = results[graph]
        ns = [row["n"] for row in rows]
        for row_index, (names, title) in enumerate(((PAPER_ESTIMATORS, "paper's estimators, per sample"),
                                                    (GROUP_ESTIMATORS, f"trainers' advantages, per group of {group_size}"))):
            ax = axes[row_index, column]
            for name in names:
                pairs = [(n, row[name]) for n, row in zip(ns, rows) if row[name]]
                if pairs:
                    ax.plot(*zip(*pairs), styles[name], label=name)
            if row_index == 0:
                ax.plot(ns, [row["sparse_theory"] for row in rows], ":", color="gray", label="Y1 theory (eq. 17)")
                ax.plot(ns, [row["segment_theory"] for row in rows], "-.", color="black", label="Y3 theory (eq. 66)")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{graph} graph (p = {p}): {title}", fontsize=9)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7)
            if column == 0:
                ax.set_ylabel("SNR = |E ĝ| / sd(ĝ)")
            if row_index == 1:
                ax.set_xlabel("horizon n")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description="SNR of sparse / trajectory / segment estimators vs n (PPM App. A)")
    parser.add_argument("--p", type=float, default=0.8, help="Per-point success probability.")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--num-groups", type=int, default=50_000)
    parser.add_argument("--horizons", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--quick", action="store_true", help="CI smoke: few groups and horizons.")
    args = parser.parse_args(argv)
    if args.quick:
        args.num_groups, args.horizons = 500, [1, 2, 4]
    if not 0 < args.p < 1:
        raise ValueError(f"--p must lie in (0, 1), got {args.p}")
    generator = torch.Generator().manual_seed(args.seed)
    results = {}
    for graph in GRAPHS:
        results[graph] = []
        for n in args.horizons:
            row = {"n": n, **simulate(graph, n, args.p, args.group_size, args.num_groups, generator),
                   **closed_form(graph, n, args.p)}
            results[graph].append(row)
    report = {"p": args.p, "group_size": args.group_size, "num_groups": args.num_groups, "results": results,
              "slopes": {graph: {name: log_log_slope([r["n"] for r in rows if r["n"] >= 4],
                                                     [r[name] for r in rows if r["n"] >= 4])
                                 for name in ("Y2", "Y3", "trajectory", "segment")}
                         for graph, rows in results.items()}}
    print(format_table(report))
    os.makedirs(args.output_dir, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    with open(os.path.join(args.output_dir, f"snr{suffix}.json"), "w") as handle:
        json.dump(report, handle, indent=2)
    plot(results, os.path.join(args.output_dir, f"snr{suffix}.png"), args.p, args.group_size)
    return report


def format_table(report: dict) -> str:
    def cell(value):
        return "—" if value is None else f"{value:.3g}"

    lines = []
    for graph, rows in report["results"].items():
        lines += [f"\n{graph} graph, p = {report['p']}, G = {report['group_size']}, {report['num_groups']} groups",
                  "| n | Y1 sparse | Y1 theory | Y2 traj. | Y3 segment | Y3 theory | GRPO sparse | GRPO sparse+std "
                  "| PPM traj. | PPM segment |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['n']} | {cell(r['Y1'])} | {cell(r['sparse_theory'])} | {cell(r['Y2'])} | {cell(r['Y3'])} | "
                  f"{cell(r['segment_theory'])} | {cell(r['sparse'])} | {cell(r['sparse+std'])} | "
                  f"{cell(r['trajectory'])} | {cell(r['segment'])} |" for r in rows]
        slopes = report["slopes"][graph]
        lines.append("log-log slope in n (n ≥ 4): " + ", ".join(f"{k} {cell(v)}" for k, v in slopes.items()))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
