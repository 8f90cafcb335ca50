"""PNG plots for the CLI: a simulation's per-second time series and the plan's cost/latency frontier.

matplotlib is imported inside each function (Agg backend, no display) so importing this module
costs nothing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from hbmserve.sim.planner import PlanCandidate
from hbmserve.sim.metrics import SimResult


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


def plot_frontier(plans: Sequence[PlanCandidate], path: str | os.PathLike[str], slo_ttft_s: float,
                  slo_tpot_s: float, title: str = "") -> None:
    """Blended $/Mtok against TPOT p95 per GPU type; the Pareto frontier of the confirmed plans is
    drawn as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [p for p in plans if p.usd_per_mtok_blended and p.tpot_p95_s is not None]
    if not pts:
        raise ValueError("no plan has both a cost and a latency to plot")
    fig, ax = plt.subplots(figsize=(9, 6))
    for gpu in sorted({p.gpu for p in pts}):
        mine = [p for p in pts if p.gpu == gpu]
        ax.scatter([p.tpot_p95_s * 1e3 for p in mine], [p.usd_per_mtok_blended for p in mine], s=14, alpha=0.6, label=gpu)
    front = _pareto([(p.tpot_p95_s * 1e3, p.usd_per_mtok_blended) for p in pts if p.feasible])
    if front:
        ax.plot([x for x, _ in front], [y for _, y in front], color="black", lw=1.2, label="frontier (confirmed)")
    ax.axvline(slo_tpot_s * 1e3, color="tab:red", ls="--", label="TPOT SLO")
    ax.set_xlabel("TPOT p95 (ms)")
    ax.set_ylabel("$ per million tokens (input + output, blended)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or f"cost/latency frontier (TTFT p95 <= {slo_ttft_s:g} s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    front: list[tuple[float, float]] = []
    for x, y in sorted(points):
        if not front or y < front[-1][1]:
            front.append((x, y))
    return front
