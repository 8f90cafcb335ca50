"""The request router as a pure function: rank replicas for one request.

The simulator (sim/cluster_sim.py) calls `choose` with loads from its simulated engines. Live
traffic does not go through it yet: replicas of a model share one port and the kernel spreads
connections (SO_REUSEPORT); the front-door ingress is where the live system will call it. Only
ACTIVE replicas are eligible; STARTING, STANDBY and DRAINING ones never receive new requests.

Ranking is least-loaded by (waiting, running, kv_usage). When the request carries a prefix hash
and some replica has that prefix cached, the least-loaded such replica goes first, unless its
queue is more than `affinity_slack` requests longer than the least-loaded replica's: a cache hit
saves one prefill, a long queue costs every request in it.
"""

from __future__ import annotations

from collections.abc import Iterable

from hbmserve.core.routing import ReplicaLoad, RouteDecision, RouteRequest
from hbmserve.core.scaling import ReplicaState

DEFAULT_AFFINITY_SLACK = 4


def _load_key(r: ReplicaLoad) -> tuple[int, int, float, str]:
    return (r.waiting, r.running, r.kv_usage, r.replica_id)


def choose(replicas: Iterable[ReplicaLoad], request: RouteRequest,
           affinity_slack: int = DEFAULT_AFFINITY_SLACK) -> RouteDecision:
    eligible = sorted((r for r in replicas if r.state is ReplicaState.ACTIVE), key=_load_key)
    if not eligible:
        return RouteDecision((), "no active replica")
    best = eligible[0]
    if request.prefix_hash is not None:
        holders = [r for r in eligible if request.prefix_hash in r.cached_prefixes]
        if holders and holders[0] is not best:
            h = holders[0]
            if h.waiting <= best.waiting + affinity_slack:
                rest = tuple(r.replica_id for r in eligible if r is not h)
                return RouteDecision(
                    (h.replica_id, *rest),
                    f"prefix affinity: {h.replica_id} has the prefix cached "
                    f"(waiting {h.waiting} vs least-loaded {best.waiting})")
            return RouteDecision(
                tuple(r.replica_id for r in eligible),
                f"least loaded: {best.replica_id}; prefix holder {h.replica_id} queue too long "
                f"({h.waiting} > {best.waiting} + {affinity_slack})")
        if holders:
            return RouteDecision(tuple(r.replica_id for r in eligible),
                                 f"least loaded and prefix cached: {best.replica_id}")
    return RouteDecision(
        tuple(r.replica_id for r in eligible),
        f"least loaded: {best.replica_id} (waiting {best.waiting}, running {best.running}, "
        f"kv {best.kv_usage:.0%})")
