"""PNG plots for the CLI: a simulation's per-second time series and the plan's cost/latency frontier.

matplotlib is imported inside each function (Agg backend, no display) so importing this module
costs nothing.
"""

from __future__ import annotations

import os

import numpy as np

from hbmserve.capacity.sim.metrics import SimResult


def plot_timeseries(result: SimResult, path: str | os.PathLike[str], title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ts = result.timeseries
    if not ts:
        raise ValueError("the simulation recorded no time series")
    t = ts["t_s"] / 60.0
    fig, axes = plt.subplots(4, 1, figsize=(10, 10), sharex=True)
    axes[0].plot(t, _smooth(ts["arrivals_per_s"]), label="arrivals/s (10 s mean)")
    axes[0].plot(t, _smooth(ts["finished_per_s"]), label="finished/s (10 s mean)")
    axes[0].set_ylabel("requests/s")
    axes[1].plot(t, _smooth(ts["output_tok_per_s"]), color="tab:green")
    axes[1].set_ylabel("output tok/s")
    axes[2].plot(t, ts["ttft_mean_s"], ".", ms=2, label="TTFT mean per second")
    axes[2].axhline(result.summary.slo_ttft_s, color="tab:red", ls="--", label="TTFT SLO")
    axes[2].set_ylabel("seconds")
    axes[2].set_yscale("log")
    axes[3].step(t, ts["active"], where="post", label="active")
    axes[3].step(t, ts["active"] + ts["starting"] + ts["standby"] + ts["draining"], where="post",
                 label="billed (incl. starting/standby/draining)")
    axes[3].plot(t, ts["waiting"], lw=0.8, label="waiting requests")
    axes[3].set_ylabel("replicas / requests")
    axes[3].set_xlabel("minutes")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper right", fontsize=8)
    fig.suptitle(title or "hbmserve simulate")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _smooth(x: np.ndarray, w: int = 10) -> np.ndarray:
    if len(x) < w:
        return x
    return np.convolve(x, np.ones(w) / w, mode="same")
