"""A trace summarised as the analytic capacity model's `Workload`: rates, peak and lengths. Here,
above both, because a trace (capacity/traces/) and the capacity model (capacity/perf/) are sibling brains."""

from __future__ import annotations

import math

import numpy as np

from hbmserve.capacity.perf.plan_analytic import Workload
from hbmserve.capacity.traces.arrivals import Arrivals


def workload_of(arrivals: Arrivals) -> Workload:
    dur = max(arrivals.duration_s, 1.0)
    rate = len(arrivals) / dur
    if dur >= 120:
        counts = np.bincount((arrivals.t // 60).astype(np.int64))
        peak = float(np.percentile(counts, 99)) / 60.0
    else:  # too short to see minute-scale bursts; assume Poisson noise
        peak = rate + 3 * math.sqrt(rate / 60.0)
    lens = arrivals.prompt + arrivals.output
    return Workload(rate_rps=rate, peak_rps=max(rate, peak), prompt_mean=float(arrivals.prompt.mean()),
                    output_mean=float(arrivals.output.mean()), prompt_p95=float(np.percentile(arrivals.prompt, 95)),
                    max_len=int(lens.max()))
