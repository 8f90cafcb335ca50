"""Replica capacity for the request lengths a model actually sees.

How many requests/s one replica carries within the SLO depends mostly on their lengths: on a
70B model a 2,000-token prompt costs about 20 times the prefill of a 100-token one, and every
output token is a decode step. `hbmserve plan` sizes a fleet for a trace's mix and writes the
figure into the config (`replica_capacity_rps`); live, the mix drifts. `replica_capacity_rps`
below is the pure function from observed length statistics to that figure (the analytic model
at the SLO alone, no utilisation cap: the policy applies its own target utilisation), and
`CapacityTable` holds it precomputed over a grid of lengths for the live policy, which Serve's
controller calls every 0.1 s, far from the model's files and too often for the model's
bisection (about 10 ms a call).

The table interpolates seconds per request (1 / capacity), not capacity: a request's cost is
close to affine in its prompt and output lengths (prefill per prompt token, a decode step share
per output token), so bilinear interpolation of it between grid points is close to exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hbmserve.capacity.perf.perf_model import StepCostModel
from hbmserve.capacity.perf.plan_analytic import EngineKnobs, Workload, capacity_rps

# Replicas report mean lengths only; the TTFT term needs the p95 prompt. A log-normal prompt
# length with CV 0.5 (the Azure conversation trace's is 0.9, the code-completion fixture's 0.4)
# has its p95 at about twice its mean.
P95_OVER_MEAN = 2.0
# 32 ... 16,384 tokens; prompts step by sqrt(2): where TTFT binds, long prompts bend the curve.
PROMPT_GRID = tuple(32.0 * 2 ** (i / 2) for i in range(19))
OUTPUT_GRID = tuple(float(8 << i) for i in range(9))  # 8 ... 2,048 tokens


@dataclass(frozen=True)
class LengthStats:
    prompt_mean: float
    output_mean: float
    prompt_p95: float | None = None  # None: P95_OVER_MEAN x the mean


def replica_capacity_rps(cost: StepCostModel, knobs: EngineKnobs, lengths: LengthStats, slo_ttft_s: float,
                         slo_tpot_s: float) -> float:
    """Requests/s one replica sustains within both p95 SLOs for requests of these lengths (0 when
    even one request at a time misses)."""
    prompt, out = max(1.0, lengths.prompt_mean), max(1.0, lengths.output_mean)
    p95 = lengths.prompt_p95 if lengths.prompt_p95 is not None else P95_OVER_MEAN * prompt
    w = Workload(rate_rps=1.0, peak_rps=1.0, prompt_mean=prompt, output_mean=out, prompt_p95=max(prompt, p95),
                 max_len=int(p95 + out))
    cap, _ = capacity_rps(cost, knobs, w, slo_ttft_s, slo_tpot_s, utilisation_cap=1.0)
    return cap


@dataclass(frozen=True)
class CapacityTable:
    """`replica_capacity_rps` on a grid: capacity[i][j] at prompts[i], outputs[j] (ascending)."""

    prompts: tuple[float, ...]
    outputs: tuple[float, ...]
    capacity: tuple[tuple[float, ...], ...]

    def rps_at(self, prompt_mean: float, output_mean: float) -> float:
        """Capacity at these mean lengths, interpolated (clamped to the grid's edges)."""
        i, u = _cell(self.prompts, prompt_mean)
        j, v = _cell(self.outputs, output_mean)
        s = 0.0
        for a, wa in ((i, 1 - u), (i + 1, u)):
            for b, wb in ((j, 1 - v), (j + 1, v)):
                if wa * wb:
                    c = self.capacity[a][b]
                    s += wa * wb * (1.0 / c if c > 0 else math.inf)
        return 1.0 / s if 0 < s < math.inf else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain lists, for Serve's policy_kwargs."""
        return {"prompts": list(self.prompts), "outputs": list(self.outputs),
                "capacity": [list(row) for row in self.capacity]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CapacityTable:
        return cls(tuple(map(float, d["prompts"])), tuple(map(float, d["outputs"])),
                   tuple(tuple(map(float, row)) for row in d["capacity"]))


def _cell(grid: tuple[float, ...], x: float) -> tuple[int, float]:
    """(i, t): x lies t of the way from grid[i] to grid[i + 1]; t == 0 at or outside the edges."""
    if len(grid) == 1 or x <= grid[0]:
        return 0, 0.0
    if x >= grid[-1]:
        return len(grid) - 1, 0.0
    i = max(k for k in range(len(grid) - 1) if grid[k] <= x)
    return i, (x - grid[i]) / (grid[i + 1] - grid[i])


def capacity_table(cost: StepCostModel, knobs: EngineKnobs, slo_ttft_s: float, slo_tpot_s: float,
                   prompts: tuple[float, ...] = PROMPT_GRID,
                   outputs: tuple[float, ...] = OUTPUT_GRID) -> CapacityTable:
    return CapacityTable(prompts, outputs, tuple(
        tuple(replica_capacity_rps(cost, knobs, LengthStats(p, o), slo_ttft_s, slo_tpot_s) for o in outputs)
        for p in prompts))
