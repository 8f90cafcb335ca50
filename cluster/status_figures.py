"""The figures `hbmserve status` adds per model: p95 TTFT and TPOT against the SLO, replicas by
role and the hourly price, from typed records (pure: tests call them with plain records)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hbmserve.core.histogram import merge, quantile
from hbmserve.core.records import DecisionRecord, Histogram, Record, ReplicaInfo, ReplicaRoles
from hbmserve.core.scaling import ReplicaState, Tier

# Serve's replica states that are on their way up, and on their way out.
_STARTING = ("STARTING", "UPDATING", "RECOVERING", "PENDING_MIGRATION")
_DRAINING = ("STOPPING",)


@dataclass(frozen=True)
class LatencyVsSlo(Record):
    """p95 over every request the model's running replicas finished since they started, from the
    engines' own histograms (PromQL's histogram_quantile arithmetic): a cumulative figure, not a
    recent window; the Grafana panel's rate() over 5 minutes is the recent one."""

    ttft_p95_s: float | None  # None: no request finished yet
    tpot_p95_s: float | None  # None: no request of two or more output tokens yet
    slo_ttft_p95_s: float | None
    slo_tpot_p95_s: float | None
    requests: int  # requests in the TTFT histogram

    @property
    def ttft_ok(self) -> bool | None:
        return _within(self.ttft_p95_s, self.slo_ttft_p95_s)

    @property
    def tpot_ok(self) -> bool | None:
        return _within(self.tpot_p95_s, self.slo_tpot_p95_s)


def _within(value: float | None, target: float | None) -> bool | None:
    return None if value is None or target is None else value <= target


def _p95(histograms: Iterable[Histogram | None]) -> tuple[float | None, int]:
    try:
        merged = merge(h for h in histograms if h is not None)
    except ValueError:  # replicas with different buckets (custom vLLM buckets mid-rollout)
        return None, 0
    return (quantile(merged, 0.95), int(merged.count)) if merged else (None, 0)


def latency_vs_slo(infos: Iterable[ReplicaInfo]) -> LatencyVsSlo | None:
    """None when no replica reported histograms (an older replica, or none running)."""
    infos = [i for i in infos if i.ttft_histogram is not None or i.tpot_histogram is not None]
    if not infos:
        return None
    ttft, requests = _p95(i.ttft_histogram for i in infos)
    tpot, _ = _p95(i.tpot_histogram for i in infos)
    return LatencyVsSlo(ttft, tpot, infos[0].slo_ttft_p95_s, infos[0].slo_tpot_p95_s, requests)


def status_roles(serve_states: Mapping[str, int], roles: Iterable[ReplicaState],
                 decision: DecisionRecord | None) -> ReplicaRoles:
    """Replicas by role from Serve's replica states, the roles the running replicas reported and
    the policy's last decision (the warm pool it sized). A running replica that did not answer
    counts as active: Serve runs it and it is routed to unless the policy said otherwise."""
    standby = sum(1 for r in roles if r is ReplicaState.STANDBY)
    return ReplicaRoles(starting=sum(serve_states.get(s, 0) for s in _STARTING),
                        active=max(0, serve_states.get("RUNNING", 0) - standby), standby=standby,
                        draining=sum(serve_states.get(s, 0) for s in _DRAINING),
                        warm=decision.target_standby.get(Tier.WARM, 0) if decision else 0)


def usd_per_hour(infos: Iterable[ReplicaInfo]) -> float | None:
    """The running replicas' hourly price; None when none reported one."""
    prices = [i.usd_per_hour for i in infos if i.usd_per_hour is not None]
    return sum(prices) if prices else None
