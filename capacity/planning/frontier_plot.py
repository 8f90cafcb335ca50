"""The planner's cost-vs-latency frontier plot (matplotlib, imported inside: Agg backend, no
display)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from hbmserve.capacity.planning.plan_types import PlanCandidate


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
