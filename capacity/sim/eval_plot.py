"""PNG of an evaluation: per policy, the load (arrivals/s) against the replicas it held; with
the static frontier (capacity/sim/frontier.py), a first panel of (GPU-hours, SLO attainment): the fixed
fleets as a curve, each policy as a point on it, above it or dominated below it.

matplotlib is imported inside the function (Agg backend, no display) so importing this module
costs nothing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from hbmserve.capacity.sim.evaluate import EvalResult


def _smooth(x: np.ndarray, w: int = 30) -> np.ndarray:
    return x if len(x) < w else np.convolve(x, np.ones(w) / w, mode="same")


def plot_frontier(ax, results: Sequence[EvalResult], frontier: Sequence[EvalResult]) -> None:
    """The fixed fleets' (GPU-hours, SLO attainment) as a curve, and each policy as a point."""
    from hbmserve.capacity.sim.frontier import dominated_by

    gpu = [f.summary.gpu_hours for f in frontier]
    slo = [100 * f.summary.slo_attainment for f in frontier]
    ax.plot(gpu, slo, "-o", color="tab:gray", ms=4, label="fixed fleets (static frontier)")
    for f, x, y in zip(frontier, gpu, slo):
        ax.annotate(f.policy.removeprefix("fixed-"), (x, y), textcoords="offset points",
                    xytext=(0, -11), ha="center", fontsize=7, color="tab:gray")
    for k, r in enumerate(results):
        beaten = bool(dominated_by(r, frontier))
        ax.plot(r.summary.gpu_hours, 100 * r.summary.slo_attainment, "x" if beaten else "D",
                color=f"C{k % 10}", ms=7,
                label=f"{r.policy}{' (dominated)' if beaten else ''}")
    ax.set_xlabel("GPU-hours")
    ax.set_ylabel("SLO attainment %")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=7, framealpha=0.6)  # "best": clear of the points
    ax.set_title("static frontier: a fixed fleet of each size (x: dominated by one)", fontsize=9,
                 loc="left")


def plot_replicas_vs_load(results: Sequence[EvalResult], path: str | os.PathLike[str],
                          title: str = "", frontier: Sequence[EvalResult] = ()) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in results if r.timeseries]
    if not shown:
        raise ValueError("no evaluation recorded a time series")
    top = 1 if frontier else 0
    fig = plt.figure(figsize=(11, 2.6 * (len(shown) + 1.5 * top) + 0.6))
    grid = fig.add_gridspec(len(shown) + top, 1, height_ratios=[3] * top + [2] * len(shown))
    if frontier:
        plot_frontier(fig.add_subplot(grid[0, 0]), results, frontier)
    first = fig.add_subplot(grid[top, 0])
    axes = [first] + [fig.add_subplot(grid[top + k, 0], sharex=first)
                      for k in range(1, len(shown))]
    for ax, r in zip(axes, shown):
        ts = r.timeseries
        t = ts["t_s"] / 60.0
        load = ax.plot(t, _smooth(ts["arrivals_per_s"]), color="tab:gray", lw=1.0,
                       label="arrivals/s (30 s mean)")
        ax.set_ylabel("requests/s")
        right = ax.twinx()
        billed = ts["active"] + ts["starting"] + ts["standby"] + ts["draining"]
        lines = right.step(t, ts["active"], where="post", color="tab:blue", label="active replicas")
        lines += right.step(t, billed, where="post", color="tab:orange", lw=0.9,
                            label="billed (+starting, standby, draining)")
        right.set_ylabel("replicas")
        right.set_ylim(0, max(float(billed.max()), 1.0) * 1.15)
        s = r.summary
        ax.set_title(f"{r.policy}: SLO {s.slo_attainment:.1%}, {s.gpu_hours:.1f} GPU-h, "
                     f"{r.scale_actions} scale actions", fontsize=9, loc="left")
        ax.grid(alpha=0.3)
        handles = load + lines
        ax.legend(handles, [h.get_label() for h in handles], loc="upper right", fontsize=7)
    for ax in axes[:-1]:
        ax.tick_params(labelbottom=False)
    axes[-1].set_xlabel("minutes")
    fig.suptitle(title or "replicas vs load")
    fig.tight_layout(rect=(0.0, 0.0, 1.0, 0.985))
    fig.savefig(path, dpi=100)
    plt.close(fig)
