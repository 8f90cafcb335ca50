"""PNG of an evaluation: per policy, the load (arrivals/s) against the replicas it held.

matplotlib is imported inside the function (Agg backend, no display) so importing this module
costs nothing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from hbmserve.sim.evaluate import EvalResult


def _smooth(x: np.ndarray, w: int = 30) -> np.ndarray:
    return x if len(x) < w else np.convolve(x, np.ones(w) / w, mode="same")


def plot_replicas_vs_load(results: Sequence[EvalResult], path: str | os.PathLike[str],
                          title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in results if r.timeseries]
    if not shown:
        raise ValueError("no evaluation recorded a time series")
    fig, axes = plt.subplots(len(shown), 1, figsize=(11, 2.6 * len(shown) + 0.6), sharex=True,
                             squeeze=False)
    for ax, r in zip(axes[:, 0], shown):
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
    axes[-1, 0].set_xlabel("minutes")
    fig.suptitle(title or "replicas vs load")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
