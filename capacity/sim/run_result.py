"""What a finished simulator run (capacity/sim/cluster_sim.py) reports: its summary, per-second time
series, the policy's decisions and per-replica statistics."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from hbmserve.capacity.sim.metrics import (AdapterLoads, ReplicaStats, RequestTimes, SimResult, meets_slo,
                                           request_latencies, summarize)

if TYPE_CHECKING:
    from hbmserve.capacity.sim.cluster_sim import _Run


def result_of(run: _Run, end: float) -> SimResult:
    """The summary, per-second series, decisions and per-replica stats of a finished run."""
    done = run.done
    arrival = np.fromiter((r.arrival for r in done), float, len(done))
    first = np.fromiter((r.first_token_t for r in done), float, len(done))
    finish = np.fromiter((r.finish_t for r in done), float, len(done))
    output = np.fromiter((r.max_tokens for r in done), np.int64, len(done))
    gpus = run.spec.deployment.num_gpus
    rep_s = sum((r.removed if r.removed is not None else end) - r.created for r in run.all)
    price = run.spec.usd_per_gpu_hour
    if price is None:
        price = run.spec.deployment.gpu.usd_per_gpu_hour
    preempt = run.preemptions_of_removed + sum(r.engine.preemptions for r in run.replicas)
    itl_v = np.concatenate(run.itl_v) if run.itl_v else np.zeros(0)
    itl_w = np.concatenate(run.itl_w) if run.itl_w else np.zeros(0)
    series = np.asarray(run.series) if run.series else np.zeros((0, 9))
    peak = int((series[:, 1] + series[:, 2] + series[:, 3] + series[:, 4]).max()) if len(series) else len(run.all)
    summary = summarize(
        arrival=arrival, first=first, finish=finish, output=output, total_requests=len(run.arr),
        rejected=run.rejected, itl_values=itl_v, itl_weights=itl_w, preemptions=preempt,
        gpu_seconds=rep_s * gpus, usd_per_gpu_hour=price, makespan_s=max(end, 1e-9),
        replica_seconds=rep_s, peak_replicas=peak, slo_ttft_s=run.spec.slo.ttft_s, slo_tpot_s=run.spec.slo.tpot_s,
        prompt_tokens=sum(r.engine.prompt_tokens for r in run.all),
        prefix_hit_tokens=sum(r.engine.prefix_hit_tokens for r in run.all),
        host_hit_tokens=sum(r.engine.host_hit_tokens for r in run.all),
        adapter_loads=sum(r.engine.lora.loads for r in run.all if r.engine.lora),
        adapter_loads_by=_adapter_loads(run))
    stats = tuple(ReplicaStats(r.rid, r.engine.steps, r.engine.busy_s, r.engine.tokens_processed,
                               r.engine.max_used_blocks, r.engine.cfg.num_blocks, r.engine.preemptions,
                               (r.removed if r.removed is not None else end) - r.created,
                               r.engine.prompt_tokens, r.engine.prefix_hit_tokens) for r in run.all)
    met = np.zeros(len(run.arr), dtype=bool)
    ttft, tpot, _ = request_latencies(arrival, first, finish, output)
    met[np.fromiter((r.rid for r in done), np.int64, len(done))] = meets_slo(
        ttft, tpot, run.spec.slo.ttft_s, run.spec.slo.tpot_s)
    return SimResult(summary, _timeseries(run, series, arrival, first, finish), tuple(run.decisions),
                     stats, RequestTimes(arrival, first, finish, output), met, run.cancelled_starts,
                     run.migrated)


def _adapter_loads(run: _Run) -> tuple[AdapterLoads, ...]:
    loads: Counter[str] = Counter()
    seconds: Counter[str] = Counter()
    for r in run.all:
        if r.engine.lora:
            loads.update(r.engine.lora.loads_by)
            seconds.update(r.engine.lora.load_s_by)
    return tuple(sorted((AdapterLoads(a, loads[a], seconds[a]) for a in set(loads) | set(seconds)),
                        key=lambda x: (-x.loads, x.adapter)))


def _timeseries(run: _Run, series: np.ndarray, arrival: np.ndarray, first: np.ndarray,
                finish: np.ndarray) -> dict[str, np.ndarray]:
    n = len(series)
    if n == 0:
        return {}
    def per_sec(times: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        idx = np.clip(times.astype(np.int64), 0, n - 1)
        return np.bincount(idx, weights=weights, minlength=n)[:n].astype(np.float64)
    ttft = first - arrival
    ttft_sum = per_sec(first, ttft)
    ttft_cnt = per_sec(first)
    with np.errstate(invalid="ignore", divide="ignore"):
        ttft_mean = np.where(ttft_cnt > 0, ttft_sum / np.maximum(ttft_cnt, 1), np.nan)
    return {
        "t_s": series[:, 0],
        "active": series[:, 1], "starting": series[:, 2], "standby": series[:, 3], "draining": series[:, 4],
        "waiting": series[:, 5], "running": series[:, 6], "kv_usage": series[:, 7], "pending": series[:, 8],
        "arrivals_per_s": per_sec(run.arr.t),
        "finished_per_s": per_sec(finish),
        "output_tok_per_s": per_sec(np.asarray(run.tokens_at), np.asarray(run.tokens_n, dtype=np.float64)),
        "ttft_mean_s": ttft_mean,
    }
