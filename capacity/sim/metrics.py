"""Turning a finished simulation into numbers: latency percentiles, goodput, GPU-hours and dollars."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

QUANTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class LatencyStats:
    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    mean: float | None

    @staticmethod
    def of(values: np.ndarray, weights: np.ndarray | None = None) -> LatencyStats:
        if values.size == 0:
            return LatencyStats(None, None, None, None, None)
        if weights is None:
            qs = np.percentile(values, QUANTILES)
            return LatencyStats(*(float(q) for q in qs), float(values.mean()))
        order = np.argsort(values, kind="stable")
        v, w = values[order], weights[order].astype(np.float64)
        cw = np.cumsum(w)
        total = cw[-1]
        if total <= 0:
            return LatencyStats(None, None, None, None, None)
        qs = [float(v[min(len(v) - 1, int(np.searchsorted(cw, q / 100.0 * total)))]) for q in QUANTILES]
        return LatencyStats(*qs, float((v * w).sum() / total))


@dataclass(frozen=True)
class AdapterLoads:
    """One LoRA adapter's loads over a run, all replicas together (capacity/perf/lora.py)."""

    adapter: str
    loads: int  # from storage into a replica's host cache
    load_s: float  # engine seconds its loads and host -> GPU slot copies stalled a step


@dataclass(frozen=True)
class SimSummary:
    requests: int
    finished: int
    rejected: int
    unfinished: int
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2e: LatencyStats
    goodput_rps: float
    slo_attainment: float
    preemptions: int
    gpu_hours: float
    cost_usd: float
    usd_per_mtok: float | None
    output_tokens: int
    makespan_s: float
    output_tok_s: float
    mean_replicas: float
    peak_replicas: int
    slo_ttft_s: float
    slo_tpot_s: float
    prompt_tokens: int = 0  # of accepted requests
    prefix_hit_tokens: int = 0  # of those, read from a prefix cache instead of computed
    host_hit_tokens: int = 0  # of those, loaded from a host-memory KV tier
    adapter_loads: int = 0  # LoRA adapters read from storage into a replica (capacity/perf/lora.py)
    adapter_loads_by: tuple[AdapterLoads, ...] = ()  # per adapter loaded, most loads first

    @property
    def prefix_hit_rate(self) -> float | None:
        return self.prefix_hit_tokens / self.prompt_tokens if self.prompt_tokens else None

    def to_json_dict(self) -> dict[str, float | int | None]:
        out: dict[str, float | int | None] = {}
        for name in ("ttft", "tpot", "itl", "e2e"):
            st: LatencyStats = getattr(self, name)
            for k, v in asdict(st).items():
                out[f"{name}_{k}_s"] = v
        for k, v in asdict(self).items():
            if k not in ("ttft", "tpot", "itl", "e2e"):
                out[k] = v
        out["prefix_hit_rate"] = self.prefix_hit_rate
        return out


@dataclass(frozen=True)
class ReplicaStats:
    replica_id: str
    steps: int
    busy_s: float
    tokens_processed: int  # prefill + decode tokens
    max_used_blocks: int
    num_blocks: int
    preemptions: int
    lifetime_s: float
    prompt_tokens: int = 0
    prefix_hit_tokens: int = 0


@dataclass(frozen=True)
class RequestTimes:
    """Per finished request, parallel arrays (seconds on the simulated clock; tokens)."""

    arrival: np.ndarray
    first: np.ndarray
    finish: np.ndarray
    output: np.ndarray


@dataclass(frozen=True)
class SimResult:
    summary: SimSummary
    # Per-second series (index = second since start): see `timeseries_keys` in cluster_sim.
    timeseries: dict[str, np.ndarray] = field(default_factory=dict)
    # (time, target_active, reason) whenever the policy changed its target.
    decisions: tuple[tuple[float, int, str], ...] = ()
    replicas: tuple[ReplicaStats, ...] = ()
    requests: RequestTimes | None = None
    # Per request of the trace, in its order: finished within both SLO targets.
    met_slo: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    # Replicas the policy started (active or standby) and removed before they ever served.
    cancelled_starts: int = 0
    # Requests a lost replica held that went on from another (capacity/sim/faults.py).
    migrated: int = 0


def request_latencies(arrival: np.ndarray, first: np.ndarray, finish: np.ndarray,
                      output: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TTFT, TPOT (NaN for single-token outputs) and E2E per finished request."""
    ttft = first - arrival
    e2e = finish - arrival
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(output > 1, (finish - first) / np.maximum(output - 1, 1), np.nan)
    return ttft, tpot, e2e


def meets_slo(ttft: np.ndarray, tpot: np.ndarray, slo_ttft_s: float, slo_tpot_s: float) -> np.ndarray:
    """Per request, whether it met both targets; a one-token reply (TPOT NaN) has no TPOT to miss.
    The one rule for goodput and SLO attainment, simulated (here) and measured (ops/bench_figures.py)."""
    return (ttft <= slo_ttft_s) & np.where(np.isnan(tpot), True, tpot <= slo_tpot_s)


def summarize(*, arrival: np.ndarray, first: np.ndarray, finish: np.ndarray, output: np.ndarray,
              total_requests: int, rejected: int, itl_values: np.ndarray, itl_weights: np.ndarray,
              preemptions: int, gpu_seconds: float, usd_per_gpu_hour: float, makespan_s: float,
              replica_seconds: float, peak_replicas: int, slo_ttft_s: float, slo_tpot_s: float,
              prompt_tokens: int = 0, prefix_hit_tokens: int = 0, host_hit_tokens: int = 0,
              adapter_loads: int = 0, adapter_loads_by: tuple[AdapterLoads, ...] = ()) -> SimSummary:
    ttft, tpot, e2e = request_latencies(arrival, first, finish, output)
    good = int(np.count_nonzero(meets_slo(ttft, tpot, slo_ttft_s, slo_tpot_s)))
    out_tokens = int(output.sum())
    gpu_hours = gpu_seconds / 3600.0
    cost = gpu_hours * usd_per_gpu_hour
    span = max(makespan_s, 1e-9)
    return SimSummary(
        requests=total_requests,
        finished=len(arrival),
        rejected=rejected,
        unfinished=total_requests - len(arrival) - rejected,
        ttft=LatencyStats.of(ttft),
        tpot=LatencyStats.of(tpot[~np.isnan(tpot)]),
        itl=LatencyStats.of(itl_values, itl_weights),
        e2e=LatencyStats.of(e2e),
        goodput_rps=good / span,
        slo_attainment=good / total_requests if total_requests else 0.0,
        preemptions=preemptions,
        gpu_hours=gpu_hours,
        cost_usd=cost,
        usd_per_mtok=cost / (out_tokens / 1e6) if out_tokens else None,
        output_tokens=out_tokens,
        makespan_s=makespan_s,
        output_tok_s=out_tokens / span,
        mean_replicas=replica_seconds / span,
        peak_replicas=peak_replicas,
        slo_ttft_s=slo_ttft_s,
        slo_tpot_s=slo_tpot_s,
        prompt_tokens=prompt_tokens,
        prefix_hit_tokens=prefix_hit_tokens,
        host_hit_tokens=host_hit_tokens,
        adapter_loads=adapter_loads,
        adapter_loads_by=adapter_loads_by,
    )
