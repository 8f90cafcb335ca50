"""The routers `choose` is measured against, with its signature and purity (ops/bench/prefix_routing.py).

- `round_robin`: replica `salt mod n` of the ACTIVE replicas in id order; with `salt` the
  request counter that is plain round robin, blind to load and prefixes.
- `power_of_two`: Ray Serve's default request router (PowerOfTwoChoicesRequestRouter): two
  replicas drawn at random, the one with fewer requests in it (waiting + running, Ray's
  "ongoing requests") wins. Ray draws with its own RNG; here the draw mixes `salt`, so a run
  replays. Ray's locality preferences and `max_ongoing_requests` back-pressure have no
  counterpart in the simulator and are left out.
- `adapter_blind`: `choose` as if the request named no LoRA adapter: each replica loads what it
  is sent (the baseline adapter-aware routing is measured against, ops/bench/lora_routing.py).
- `least_loaded`: strictly the least loaded by (waiting, running, kv_usage), blind to prefixes
  (`choose` before prefix hashes, and vidur's LOR scheduler): the ablation that shows what
  stale stats do to a deterministic pick.

Both rank the pick first, then the rest least loaded first, as `choose` does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from hbmserve.core.routing import ReplicaLoad, RouteDecision, RouteRequest, Router
from hbmserve.core.scaling import ReplicaState
from hbmserve.routing.choose import active_by_load, choose, two_choices


def _decision(pick: ReplicaLoad, by_load: list[ReplicaLoad], why: str) -> RouteDecision:
    return RouteDecision((pick.replica_id, *(r.replica_id for r in by_load if r is not pick)), why)


def round_robin(replicas: Iterable[ReplicaLoad], request: RouteRequest) -> RouteDecision:
    reps = list(replicas)
    by_id = sorted((r for r in reps if r.state is ReplicaState.ACTIVE), key=lambda r: r.replica_id)
    if not by_id:
        return RouteDecision((), "no active replica")
    pick = by_id[request.salt % len(by_id)]
    return _decision(pick, active_by_load(reps), f"round robin: request {request.salt} -> {pick.replica_id}")


def power_of_two(replicas: Iterable[ReplicaLoad], request: RouteRequest) -> RouteDecision:
    by_load = active_by_load(replicas)
    if len(by_load) <= 1:
        return RouteDecision(tuple(r.replica_id for r in by_load),
                             "only one active replica" if by_load else "no active replica")
    # Draw from the id order, not the load order: Ray samples replicas blind, then compares.
    by_id = sorted(by_load, key=lambda r: r.replica_id)
    i, j = two_choices(len(by_id), request.salt)
    a, b = by_id[i], by_id[j]
    pick = b if b.waiting + b.running < a.waiting + a.running else a
    other = b if pick is a else a
    return _decision(pick, by_load, f"power of two: {pick.replica_id} ({pick.waiting + pick.running} ongoing) "
                                    f"over {other.replica_id} ({other.waiting + other.running})")


def adapter_blind(replicas: Iterable[ReplicaLoad], request: RouteRequest) -> RouteDecision:
    return choose(replicas, dataclasses.replace(request, adapter=None))


def least_loaded(replicas: Iterable[ReplicaLoad], request: RouteRequest) -> RouteDecision:
    by_load = active_by_load(replicas)
    if not by_load:
        return RouteDecision((), "no active replica")
    return _decision(by_load[0], by_load, f"least loaded: {by_load[0].replica_id}")


ROUTERS: Mapping[str, Router] = {"choose": choose, "round-robin": round_robin, "power-of-two": power_of_two,
                                 "least-loaded": least_loaded, "choose-adapter-blind": adapter_blind}
