"""`training_curves.png`: a picture of a run from the trainer's `state.log_history`.

One panel per kind of metric the run logged, and none for a kind it did not: the reward (TRL's mean, and each
reward function's when there are several), PPM's progress (`ppm/final_progress`, per segment thinner), PAPO's
process-active share (`papo/proc_active_fraction`), ARG's rescue rate (`arg/rescue_rate`) and the judge's spend
(cumulative tokens, and dollars when LiteLLM priced any answer). `curve_panels` is the pure part; `plot_training_curves`
draws it with matplotlib's Agg backend, imported only then.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

CURVES_FILE = "training_curves.png"


@dataclass
class Panel:
    title: str
    ylabel: str
    series: dict[str, tuple[list[int], list[float]]] = field(default_factory=dict)  # label -> (steps, values)
    thin: set[str] = field(default_factory=set)  # labels drawn as context, not as the headline


def _series(history: list[dict], key: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for entry in history:
        if "train_runtime" in entry:  # TRL's end-of-training entry: run totals (the judge's), not a step
            continue
        value = entry.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and "step" in entry:
            steps.append(int(entry["step"]))
            values.append(float(value))
    return steps, values


def _cumulative(series: tuple[list[int], list[float]]) -> tuple[list[int], list[float]]:
    steps, values = series
    total, running = 0.0, []
    for value in values:
        total += value
        running.append(total)
    return steps, running


def curve_panels(history: list[dict]) -> list[Panel]:
    """The panels a run's log history supports, in a fixed order; empty when it logged none of these metrics."""
    keys = {key for entry in history for key in entry}
    panels = []

    reward = Panel("reward", "mean reward")
    if "reward" in keys:
        reward.series["total"] = _series(history, "reward")
    functions = sorted(k for k in keys if re.fullmatch(r"rewards/[^/]+/mean", k))
    if len(functions) > 1:  # with one function its mean is the total
        for key in functions:
            reward.series[key.split("/")[1]] = _series(history, key)
            reward.thin.add(key.split("/")[1])
    panels.append(reward)

    progress = Panel("PPM progress", "fraction of reasoning points reached")
    if "ppm/final_progress" in keys:
        progress.series["final"] = _series(history, "ppm/final_progress")
    segments = sorted((k for k in keys if re.fullmatch(r"ppm/progress_segment_\d+", k)),
                      key=lambda k: int(k.rsplit("_", 1)[1]))
    for key in segments:
        label = f"after segment {key.rsplit('_', 1)[1]}"
        progress.series[label] = _series(history, key)
        progress.thin.add(label)
    panels.append(progress)

    active = Panel("PAPO process-active share", "groups whose process advantage moves a row")
    if "papo/proc_active_fraction" in keys:
        active.series["process-active"] = _series(history, "papo/proc_active_fraction")
    panels.append(active)

    rescue = Panel("ARG rescue rate", "all-failure groups rescued")
    if "arg/rescue_rate" in keys:
        rescue.series["rescue rate"] = _series(history, "arg/rescue_rate")
    panels.append(rescue)

    tokens = Panel("judge tokens (cumulative)", "tokens")
    for kind in ("prompt", "completion"):
        if f"judge/{kind}_tokens" in keys:
            tokens.series[kind] = _cumulative(_series(history, f"judge/{kind}_tokens"))
    panels.append(tokens)

    cost = Panel("judge cost (cumulative)", "USD")
    spent = _cumulative(_series(history, "judge/cost"))
    if spent[1] and spent[1][-1] > 0:  # an unpriced judge logs 0: no dollar panel then
        cost.series["cost"] = spent
    panels.append(cost)

    return [panel for panel in panels if any(steps for steps, _ in panel.series.values())]


def plot_training_curves(history: list[dict], path: str, title: str | None = None) -> list[str]:
    """Draw `curve_panels(history)` into `path` (PNG); returns the panel titles, [] (and no file) when none."""
    panels = curve_panels(history)
    if not panels:
        return []
    import matplotlib

    matplotlib.use("Agg")  # no display needed, whatever backend the environment names
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    columns = min(len(panels), 3)
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.2 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        for label, (steps, values) in panel.series.items():
            thin = label in panel.thin
            ax.plot(steps, values, label=label, linewidth=0.8 if thin else 1.8, alpha=0.6 if thin else 1.0,
                    marker="o" if len(steps) < 20 else None, markersize=3)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(panel.ylabel, fontsize=8)
        ax.grid(alpha=0.3)
        if len(panel.series) > 1:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [panel.title for panel in panels]


def save_training_curves(history: list[dict], output_dir: str, title: str | None = None) -> tuple[str | None, str | None]:
    """(path of `output_dir/training_curves.png`, None) when drawn; (None, one line saying why not) without
    matplotlib; (None, None) when the history has nothing to draw."""
    import importlib.util
    import os

    if importlib.util.find_spec("matplotlib") is None:
        return None, f"no {CURVES_FILE}: matplotlib is not installed (pip install matplotlib)"
    path = os.path.join(output_dir, CURVES_FILE)
    return (path if plot_training_curves(history, path, title) else None), None
