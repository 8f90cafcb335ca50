"""Where splitting starts to pay (issue 23): the aggregated-or-split plan (disagg_plan.py) run again
as one knob sweeps, the rest of the workload held, and the values where the winner changes.

Two knobs. "prompt": synthetic traffic of each mean prompt length, the trace's mean output, at
the rate that keeps the trace's tokens per second (input and output), so the fleets stay of a
size and the dollars compare per token. "tpot": the trace itself under each TPOT target. Each
crossover is interpolated on the log of the knob between two neighbours (of the points where some
layout met the SLO) whose winners differ, where the log of aggregated $/Mtok over split's crosses
zero (at their geometric mean when one of the two met the SLO with one kind only). The plot (matplotlib, imported inside: Agg
backend, no display) draws each kind's cheapest layout meeting the SLO, its GPUs beside it, a
cross where it missed, and the crossovers. Pure apart from CPU time, the plot aside.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hbmserve.capacity.perf.perf_model import Deployment
from hbmserve.capacity.planning.disagg_plan import AGGREGATED, SPLIT, ServingOption, plan_disagg
from hbmserve.capacity.traces.arrivals import Arrivals, gamma_arrivals
from hbmserve.core.config import SloSeconds

KNOBS = {"prompt": "mean prompt tokens", "tpot": "TPOT p95 target (ms)"}
LENGTH_CV = 0.5  # the prompt sweep's lengths: lognormal with this spread, as the CLI's synthetic loads


@dataclass(frozen=True)
class BreakEvenPoint:
    value: float  # the knob's: mean prompt tokens, or the TPOT target in seconds
    rate_rps: float
    aggregated: ServingOption | None  # each kind's first in the plan's ranking
    disaggregated: ServingOption | None
    winner: str  # the plan's pick's kind; "none" where no layout met the SLO


@dataclass(frozen=True)
class BreakEven:
    knob: str  # a key of KNOBS
    points: tuple[BreakEvenPoint, ...]  # by the knob, ascending
    crossovers: tuple[float, ...]  # the knob's values where the winner changes; none: one kind wins throughout
    tokens_per_s: float  # input and output, the trace's


def break_even(dep: Deployment, arrivals: Arrivals, slo: SloSeconds, knob: str, values: Sequence[float],
               duration_s: float, seed: int = 0, **plan_kw) -> BreakEven:
    """`plan_disagg` at each of `values` of `knob` (module docstring), on `duration_s` seconds of traffic."""
    if knob not in KNOBS:
        raise ValueError(f"knob must be one of {', '.join(KNOBS)}, not {knob!r}")
    span = max(arrivals.duration_s, 1e-9)
    tokens_per_s = float(arrivals.prompt.sum() + arrivals.output.sum()) / span
    output = float(arrivals.output.mean())
    points = []
    for v in sorted(values):
        if knob == "prompt":
            rate = tokens_per_s / (v + output)
            arr = gamma_arrivals(rate, duration_s, 1.0, v, output, length_cv=LENGTH_CV, seed=seed)
            target = slo
        else:
            arr, target = arrivals.window(0.0, duration_s), replace(slo, tpot_s=v)
            rate = len(arr) / max(arr.duration_s, 1e-9)
        plan = plan_disagg(dep, arr, target, **plan_kw)
        winner = plan.best.kind if plan.best.meets_slo else "none"
        points.append(BreakEvenPoint(v, rate, plan.best_of(AGGREGATED), plan.best_of(SPLIT), winner))
    return BreakEven(knob, tuple(points), crossovers(points), tokens_per_s)


def crossovers(points: Sequence[BreakEvenPoint]) -> tuple[float, ...]:
    """The knob's values where the winner changes (module docstring); points where nothing met are skipped."""
    won = [p for p in points if p.winner in (AGGREGATED, SPLIT)]
    out = []
    for a, b in zip(won, won[1:]):
        if a.winner != b.winner:
            ga, gb = _gap(a), _gap(b)
            t = ga / (ga - gb) if math.isfinite(ga) and math.isfinite(gb) and ga != gb else 0.5
            t = min(1.0, max(0.0, t))
            out.append(math.exp(math.log(a.value) + t * (math.log(b.value) - math.log(a.value))))
    return tuple(out)


def _met(o: ServingOption | None) -> bool:
    return o is not None and o.meets_slo and o.usd_per_mtok is not None


def _gap(p: BreakEvenPoint) -> float:
    """log of aggregated $/Mtok over split's: > 0 where splitting is cheaper; +-inf where one missed."""
    a, s = (o.usd_per_mtok if _met(o) else math.inf for o in (p.aggregated, p.disaggregated))
    if math.isfinite(a) and math.isfinite(s):
        return math.log(a / s)
    return math.inf if math.isfinite(s) else -math.inf


def plot_break_even(be: BreakEven, path: str | os.PathLike[str], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scale = 1e3 if be.knob == "tpot" else 1.0
    costs = [o.usd_per_mtok for p in be.points for o in (p.aggregated, p.disaggregated) if _met(o)]
    if not costs:
        raise ValueError("no layout met the SLO at any point of the sweep: nothing to plot")
    top = max(costs) * 1.15
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for label, color, pick, lift in (("aggregated", "tab:blue", lambda p: p.aggregated, 1.0),
                                     ("disaggregated (split)", "tab:orange", lambda p: p.disaggregated, 0.96)):
        met = [(p.value * scale, pick(p)) for p in be.points if _met(pick(p))]
        ax.plot([x for x, _ in met], [o.usd_per_mtok for _, o in met], "o-", color=color, label=label)
        for x, o in met:
            ax.annotate(f"{o.gpus} GPUs", (x, o.usd_per_mtok), textcoords="offset points", xytext=(4, 6 if
                        color == "tab:blue" else -12), fontsize=7, color=color)
        missed = [p.value * scale for p in be.points if not _met(pick(p))]
        if missed:
            ax.scatter(missed, [top * lift] * len(missed), marker="x", color=color, label=f"{label}: misses the SLO")
    for i, x in enumerate(be.crossovers):
        ax.axvline(x * scale, color="black", ls="--", lw=1,
                   label=None if i else "break-even: " + ", ".join(
                       f"~{c * scale:,.{0 if be.knob == 'prompt' else 1}f}" for c in be.crossovers))
    ax.set_xscale("log")
    ax.set_xticks([p.value * scale for p in be.points], [f"{p.value * scale:g}" for p in be.points])
    ax.minorticks_off()
    ax.set_xlabel(KNOBS[be.knob] + (f" (rate keeps {be.tokens_per_s:,.0f} tokens/s)" if be.knob == "prompt" else ""))
    ax.set_ylabel("$ per million tokens (input + output), simulated")
    ax.set_ylim(0, top * 1.08)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
