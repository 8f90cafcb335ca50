"""Closed-form estimates of one replica's latency under load, used to prune the plan search.

Steps alternate between two kinds, and the model keeps them apart (blending them into one
average step hides that a prefill chunk is compute-bound while a decode step is HBM-bound):
  - prefill steps: each prompt needs ceil(P / (budget - b)) chunks, so n_p = lambda * chunks
    steps per second of t_p each (with chunked prefill the b decoding sequences ride along; without
    it, vLLM V0 style, decodes stall during prefill-only steps);
  - decode steps fill the rest of each second, t_d each, with b = lambda * O * TPOT sequences.
TPOT is one over the decode-advancing steps per second (a fixed point in b); its p95 adds the
Poisson spread of prefill steps a request lives through. TTFT is the p95 prompt's prefill plus an
M/M/1-style queueing wait at the busier of prefill time and KV/sequence slots. These estimates
rank configurations; the planner confirms the best with the discrete-event simulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hbmserve.capacity.perf.perf_model import StepCostModel

UTILISATION_CAP = 0.8


@dataclass(frozen=True)
class Workload:
    rate_rps: float  # mean
    peak_rps: float  # the rate a static plan is sized for (busiest minute)
    prompt_mean: float
    output_mean: float
    prompt_p95: float
    max_len: int  # longest prompt + output


@dataclass(frozen=True)
class EngineKnobs:
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    kv_tokens: int


@dataclass(frozen=True)
class LoadEstimate:
    rate_rps: float
    overloaded: bool
    batch: float  # decode sequences per step
    step_s: float
    ttft_p95_s: float
    tpot_p95_s: float
    utilisation: float
    reason: str


def _slots(k: EngineKnobs, w: Workload) -> float:
    # KV per sequence grows from P to P+O; average occupancy is P + O/2 tokens.
    return float(min(k.max_num_seqs, k.kv_tokens / max(1.0, w.prompt_mean + w.output_mean / 2)))


def estimate(cost: StepCostModel, k: EngineKnobs, w: Workload, rate: float) -> LoadEstimate:
    """Latency estimate at `rate` requests/s on one replica."""
    P, out = w.prompt_mean, max(1.0, w.output_mean)
    ctx = P + out / 2
    slots = _slots(k, w)
    overhead = cost.dep.gpu.overheads.request_s

    def prefill_steps(b: float, prompt: float) -> tuple[float, float]:
        """(steps per prompt, seconds per step) for one prompt's prefill next to b decodes."""
        room = k.max_num_batched_tokens - (b if k.chunked_prefill else 0.0)
        n = max(1, math.ceil(prompt / max(1.0, room)))
        chunk = prompt / n
        dec = max(0.0, b) if k.chunked_prefill else 0.0
        t = float(cost.step_time(dec, dec * ctx, chunk, chunk * (prompt + chunk) / 2, prompt, 1))
        return n, t

    tpot = float(cost.step_time(1, ctx))
    b = n_p = t_p = t_d = 0.0
    busy_pre = 0.0
    for _ in range(80):
        b = min(rate * out * tpot, 10 * slots)
        steps, t_p = prefill_steps(b, P)
        n_p = rate * steps
        busy_pre = n_p * t_p
        t_d = float(cost.step_time(max(1.0, b), max(1.0, b) * ctx))
        if busy_pre >= 1.0:
            break
        advancing = n_d = (1.0 - busy_pre) / t_d
        if k.chunked_prefill:
            advancing = n_d + n_p
        new = 1.0 / advancing
        if abs(new - tpot) < 1e-7 * tpot:
            tpot = new
            break
        tpot = 0.5 * (tpot + new)
    over = busy_pre >= 1.0 or b > slots
    # A request lives out * TPOT seconds; the prefill steps it shares follow a Poisson count.
    life = out * tpot
    mean_k = n_p * life
    k95 = mean_k + 1.645 * math.sqrt(mean_k)
    extra = t_p - (0.0 if not k.chunked_prefill else t_d) if t_p > t_d or not k.chunked_prefill else 0.0
    tpot95 = tpot + max(0.0, k95 - mean_k) * extra / out
    util = max(busy_pre, b / slots)
    rho = min(util, 0.999)
    steps95, t_p95 = prefill_steps(b, w.prompt_p95)
    service = steps95 * t_p95 + t_d  # wait for the step in flight, then the prompt's chunks
    wait = 3.0 * rho / (1.0 - rho) * (P / max(1.0, w.prompt_p95) * service)
    ttft = overhead + service + wait
    if over:
        reason = "overloaded: " + ("sequence/KV slots" if b > slots else "prefill time")
    else:
        reason = (f"batch {b:.1f} of {slots:.0f} slots, {busy_pre:.0%} of time in prefill, "
                  f"decode step {t_d * 1e3:.1f} ms")
    return LoadEstimate(rate, over, b, t_d, ttft, tpot95, util, reason)


def capacity_rps(cost: StepCostModel, k: EngineKnobs, w: Workload, slo_ttft_s: float,
                 slo_tpot_s: float, utilisation_cap: float = UTILISATION_CAP) -> tuple[float, LoadEstimate]:
    """Highest per-replica rate that meets both p95 SLOs under the utilisation cap (0 if none);
    `utilisation_cap` 1.0 gives the rate the SLO alone allows (what the simulator measures).

    Returns the rate and the estimate at a light load (used to explain an infeasible config).
    """
    light = estimate(cost, k, w, 1e-3)

    def ok(rate: float) -> bool:
        e = estimate(cost, k, w, rate)
        return (not e.overloaded and e.utilisation <= utilisation_cap
                and e.ttft_p95_s <= slo_ttft_s and e.tpot_p95_s <= slo_tpot_s)

    if not ok(1e-3):
        return 0.0, light
    hi = cost.roofline_tokens_per_s() / max(1.0, w.prompt_mean + w.output_mean)
    lo = 1e-3
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
        if hi / lo < 1.01:
            break
    return lo, light


def prefill_capacity_rps(cost: StepCostModel, k: EngineKnobs, w: Workload, slo_ttft_s: float) -> float:
    """Requests/s one replica of a disaggregated prefill pool serves within the TTFT p95 target:
    `capacity_rps` on the prompts alone (each request one output token there), queueing included.
    Well under its raw prompt-token rate over the prompt mean: about a third for 6k-token prompts
    at 2 s on a 70B TP4 H100 replica. 0 when one prompt alone misses the target."""
    rps, _ = capacity_rps(cost, k, replace(w, output_mean=1.0), slo_ttft_s, math.inf, utilisation_cap=1.0)
    return rps

