"""Sizing a model's host-memory KV tier: what host memory costs against the GPU-hours it saves.

A host tier (vLLM's --kv-offloading-size, `engine_settings.kv_offload_gib`) keeps KV blocks HBM
has evicted; a request that finds its prompt there loads it over PCIe instead of recomputing it.
That lowers TTFT and frees prefill compute, so the same traffic may meet the SLO on fewer
replicas. Whether that pays depends on the trace: how much of it comes back after HBM has let
go of it (the gap between the aggregate-LRU bound of HBM alone and the infinite-cache bound,
capacity/sim/prefix_bounds.py) and how much GPU time its prefill costs.

For each candidate size, the simulator finds the fewest replicas that meet the SLO on the trace
(confirm.py `smallest_fleet`, the planner's own search) with the router that ships (`choose` on
the engines' KV events); the plan's cost is its GPU-hours at the GPU's price plus the tier's
GiB-hours at `usd_per_gib_hour`. The cheapest size wins; the reason says what it saves against
no tier, or why no tier is best. Pure apart from CPU time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from hbmserve.capacity.perf.engine_core import EngineConfig
from hbmserve.capacity.perf.perf_model import Deployment
from hbmserve.capacity.planning.confirm import smallest_fleet
from hbmserve.capacity.traces.arrivals import Arrivals
from hbmserve.core.config import SloSeconds

GIB = 1 << 30
DEFAULT_SIZES_GIB = (0.0, 64.0, 128.0, 256.0, 512.0, 1024.0)
# Host DRAM in a cloud GPU node, USD per GiB-hour: an input the user should set from their own
# price list (--host-usd-per-gib-hour). This default is of the order of public cloud list
# prices for memory added to a VM (about $0.004-0.01 per GiB-hour in 2026), not a measurement.
DEFAULT_USD_PER_GIB_HOUR = 0.005


@dataclass(frozen=True)
class TierOption:
    host_gib: float  # per replica
    replicas: int  # the fewest that meet the SLO on the trace (the largest tried when none does)
    meets_slo: bool
    prefix_hit_rate: float
    host_hit_rate: float  # of prompt tokens, served from the tier
    ttft_p95_s: float | None
    gpu_hours: float
    host_gib_hours: float
    usd: float


@dataclass(frozen=True)
class HostTierPlan:
    options: tuple[TierOption, ...]  # in the order of the sizes asked
    best: TierOption
    reason: str


def size_host_tier(dep: Deployment, eng: EngineConfig, slo: SloSeconds, arrivals: Arrivals, replicas_guess: int,
                   usd_per_gpu_hour: float, usd_per_gib_hour: float = DEFAULT_USD_PER_GIB_HOUR,
                   sizes_gib: Sequence[float] = DEFAULT_SIZES_GIB) -> HostTierPlan:
    if not eng.enable_prefix_caching:
        raise ValueError("a host KV tier serves the prefix cache: set engine_settings.enable_prefix_caching")
    if not sizes_gib or any(s < 0 for s in sizes_gib):
        raise ValueError("host tier sizes must be >= 0 GiB")
    if usd_per_gib_hour < 0 or usd_per_gpu_hour < 0:
        raise ValueError("prices must be >= 0")
    per_tok = dep.model.kv_bytes_per_token_per_rank(dep.tp, dep.pp)
    gpus = dep.tp * dep.pp
    options = []
    for gib in sizes_gib:
        cfg = dataclasses.replace(eng, host_kv_tokens=int(gib * GIB / per_tok))
        run = smallest_fleet(dep, cfg, slo, arrivals, replicas_guess)
        s = run.summary
        hours = s.makespan_s / 3600
        gpu_h = run.replicas * gpus * hours
        gib_h = run.replicas * gib * hours
        prompt = s.prompt_tokens or 1
        options.append(TierOption(gib, run.replicas, run.ok, s.prefix_hit_rate or 0.0, s.host_hit_tokens / prompt,
                                  s.ttft.p95, gpu_h, gib_h, gpu_h * usd_per_gpu_hour + gib_h * usd_per_gib_hour))
    return HostTierPlan(tuple(options), *_pick(options))


def _pick(options: list[TierOption]) -> tuple[TierOption, str]:
    meeting = [o for o in options if o.meets_slo] or options
    best = min(meeting, key=lambda o: (o.usd, o.host_gib))
    base = next((o for o in options if o.host_gib == 0), None)
    if not any(o.meets_slo for o in options):
        return best, "no size meets the SLO within the replica counts tried: the cheapest is shown"
    if best.host_gib == 0:
        return best, "no tier: host memory would cost more than the GPU-hours it saves on this trace"
    if base is None:
        return best, f"{best.host_gib:g} GiB per replica is the cheapest size asked"
    if not base.meets_slo:
        return best, (f"{best.host_gib:g} GiB per replica: without a tier no replica count tried meets the SLO; "
                      f"with it {best.replicas} do")
    saved = base.gpu_hours - best.gpu_hours
    return best, (f"{best.host_gib:g} GiB per replica pays: {best.replicas} replicas instead of {base.replicas}, "
                  f"{saved:.1f} GPU-h saved for {best.host_gib_hours:,.0f} GiB-h of host memory, "
                  f"${base.usd - best.usd:,.2f} less over the trace")
