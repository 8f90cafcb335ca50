"""The warm tier as nodes: every model's wish turned into one cluster-wide node request.

Ray's node autoscaler takes `request_resources(bundles=...)` as a floor on the cluster's total
resources: it adds nodes until every bundle would fit, counting the nodes' total resources, not
what is free on them, and each call replaces the one before (docs: "request_resources(num_cpus=100)
with 45 running tasks adds nodes so that up to 100 can run, not 145"). Two consequences:

* asking for the warm nodes alone would be met by the nodes the serving replicas already fill,
  so the request holds every model's serving fleet, hot standbys and warm nodes together;
* a request per model would erase the others', so there is one request for the whole cluster,
  built here from every model's wish at once.

A warm node is one replica's worth of resources (its bundles) with nothing running on it: the
node the next replica of that model lands on, its weights already in the node's cache.

`live_warm_target` is the gate the live policy applies to its warm-pool wish: a warm node is only
real when a node autoscaler can add it and the model's weights go through a cache to prefetch.

Pure: no I/O, no clock (time arrives as `now`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hbmserve.core.records import WarmTierRecord

Bundle = Mapping[str, float]


@dataclass(frozen=True)
class ModelWish:
    """What one model wants of the cluster's nodes, from its last scaling decision."""

    model: str
    # One replica's resource bundles (what Ray schedules it with); a warm node must hold them.
    # Empty or all-zero: the replica needs no node resource, so no node is asked for it.
    replica_shape: tuple[Bundle, ...]
    running: int  # replicas Serve runs now (active, standby, starting, draining)
    target_active: int
    hot: int = 0  # hot standbys: loaded engines, so they hold a replica's resources too
    warm: int = 0  # warm nodes: a replica's resources, empty, weights in the node's cache

    @property
    def replicas(self) -> int:
        """Replicas' worth of resources to hold: never fewer than run now (a scale-down frees
        nodes only once its replicas are gone), plus the warm nodes on top."""
        return max(self.running, self.target_active + self.hot) + self.warm


@dataclass(frozen=True)
class NodeRequest:
    """The one request for the whole cluster, in a canonical order (equal wishes, equal
    requests, so an adapter calls Ray only when this changes)."""

    bundles: tuple[dict[str, float], ...]
    reason: str


def _clean(bundle: Bundle) -> dict[str, float]:
    return {k: float(v) for k, v in sorted(bundle.items()) if v > 0}


def shape_of(wish: ModelWish) -> tuple[dict[str, float], ...]:
    """The wish's replica shape without zero amounts or empty bundles."""
    return tuple(b for b in (_clean(b) for b in wish.replica_shape) if b)


def cluster_request(wishes: Sequence[ModelWish]) -> NodeRequest:
    """Every model's serving fleet, hot standbys and warm nodes as one list of bundles."""
    bundles: list[dict[str, float]] = []
    parts: list[str] = []
    for wish in sorted(wishes, key=lambda w: w.model):
        shape = shape_of(wish)
        if not shape:
            parts.append(f"{wish.model}: needs no node resources")
            continue
        bundles.extend(dict(b) for _ in range(wish.replicas) for b in shape)
        parts.append(f"{wish.model}: {wish.replicas} x {_describe(shape)} "
                     f"(max(running {wish.running}, active {wish.target_active} + hot {wish.hot})"
                     f" + warm {wish.warm})")
    return NodeRequest(tuple(bundles), "; ".join(parts) or "no models")


def _describe(shape: tuple[dict[str, float], ...]) -> str:
    return "+".join("{" + ", ".join(f"{k}: {v:g}" for k, v in b.items()) + "}" for b in shape)


def fits(bundle: Bundle, node: Mapping[str, float]) -> bool:
    return all(node.get(k, 0.0) >= v for k, v in _clean(bundle).items())


def models_for_node(node_resources: Mapping[str, float], shapes: Mapping[str, Sequence[Bundle]]) -> tuple[str, ...]:
    """The models whose weights a node should hold: those with a bundle the node can run (a
    pipeline stage on it reads the model too). Models that need no node resource are left out:
    they could land anywhere, so no node is theirs to prefetch."""
    out = []
    for model, shape in sorted(shapes.items()):
        cleaned = [b for b in (_clean(b) for b in shape) if b]
        if cleaned and any(fits(b, node_resources) for b in cleaned):
            out.append(model)
    return tuple(out)


def live_warm_target(wanted: int, deployment: str, tier: WarmTierRecord | None, now: float,
                     ttl_s: float) -> tuple[int, str]:
    """The warm nodes the live system can keep for `deployment` (<= wanted), and why, when that
    is fewer. Only a running aggregator (a fresh record) turns the wish into nodes, only a node
    autoscaler adds them, and only a model in the cache with a node-sized replica is warmable."""
    if wanted <= 0:
        return 0, ""
    if tier is None or now - tier.at > ttl_s:
        why = "no warm-tier aggregator runs (no model with a warm pool was deployed with a cache)"
    elif not tier.node_autoscaler:
        why = "the cluster has no node autoscaler to add warm nodes"
    elif deployment not in tier.warmable:
        why = "its replicas need no node resources or its weights do not go through the cache"
    else:
        return wanted, ""
    return 0, f"warm {wanted}->0: {why}"
