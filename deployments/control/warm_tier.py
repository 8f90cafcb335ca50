"""The warm tier, live: one aggregator for the whole cluster asks Ray's node autoscaler for the
warm nodes every model's policy wants, and prefetches each joining node's weights.

Every TICK_S the aggregator
1. reads every model's last decision (records_store.latest_decision) and turns all of them into
   one list of bundles (autoscale/warm_nodes.py `cluster_request`: serving fleet, hot standbys
   and warm nodes together, because Ray's request is a floor on the cluster's total resources
   and each call replaces the last); it calls `ray.autoscaler.sdk.request_resources` only when
   that list changed;
2. runs, on each node it has not seen before, a task pinned there (NodeAffinitySchedulingStrategy,
   soft=False) that resolves the weights of the models that node can host into the node's cache
   (weights.resolve, the call replicas make, same cache root) and pins them for the warm pool;
   a replica that later lands there finds them: a cache hit, started from local disk;
3. publishes what it asked and prefetched (core/records.py `WarmTierRecord`, KV `warm-tier`),
   which the policy reads to keep a warm pool at all (autoscale/warm_nodes.py `live_warm_target`)
   and `hbmserve status --json` shows.

Why a Serve deployment (one replica, on the head node) rather than a detached actor: its life is
the models'. `hbmserve down` shuts Serve down and it goes with them, so no request for nodes
outlives the models it was made for (a detached actor would keep billed nodes up after the
models are gone, until someone found and killed it); Serve restarts it if it dies; and it is
deployed by the same `deploy` as the front door, only when some model has a warm pool.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from hbmserve.autoscale.warm_nodes import ModelWish, cluster_request, models_for_node
from hbmserve.core.cache_spec import WeightCacheSpec
from hbmserve.core.config import ClusterSpec, ModelSpec
from hbmserve.core.records import Prefetch, WarmTierRecord
from hbmserve.core.scaling import Tier
from hbmserve.deployments.wire.records_store import RENEW_S, latest_decision, publish_warm_tier
from hbmserve.deployments.wire.names import engine_deployment_name
from hbmserve.deployments.wire.resources import replica_shape

log = logging.getLogger("hbmserve.warmtier")

TICK_S = RENEW_S
# Ray's autoscaler (v1) writes its status to the KV every few seconds; older than this, it is gone.
AUTOSCALER_STATUS_FRESH_S = 60.0
KEEP_PREFETCHES = 64  # the newest prefetch outcomes kept in the record


def warmable(spec: ClusterSpec, model: ModelSpec) -> bool:
    """A model whose warm wish can become a prefetched node: it has a warm pool, its replicas
    need node resources (something to add a node for) and its weights go through the cache.
    Planned models have fixed replicas (core/config.py refuses autoscaling with placement)."""
    a = model.autoscaling
    needs_node = any(v > 0 for b in replica_shape(model) for v in b.values())
    return (a is not None and a.warm_pool.max > 0 and model.reads_weights and needs_node
            and not spec.plans_placement(model))


def wish_of(model: ModelSpec) -> ModelWish:
    """The model's wish from its last decision; a fixed model wants its replicas."""
    shape = replica_shape(model)
    if model.autoscaling is None:
        return ModelWish(model.name, shape, running=model.replicas, target_active=model.replicas)
    d = latest_decision(model.name, engine_deployment_name(model))
    if d is None:  # its policy has not run yet
        return ModelWish(model.name, shape, running=0, target_active=model.autoscaling.min_replicas)
    return ModelWish(model.name, shape, running=len(d.active_replicas) + len(d.standby_replicas),
                     target_active=d.target_active, hot=d.target_standby.get(Tier.HOT, 0),
                     warm=d.target_standby.get(Tier.WARM, 0))


def node_autoscaler_running(now: float) -> bool:
    """Ray's autoscaler v1 renews its status in the KV; v2 (KubeRay's newer one) says so in GCS."""
    from ray._private import ray_constants
    from ray.experimental import internal_kv

    raw = internal_kv._internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS)
    if raw:
        try:
            return now - float(json.loads(raw).get("time", 0.0)) <= AUTOSCALER_STATUS_FRESH_S
        except (ValueError, TypeError):
            return False
    from ray.autoscaler.v2.utils import is_autoscaler_v2

    return bool(is_autoscaler_v2())


def prefetch(node_id: str, models: list[tuple[str, str]], cache_json: str) -> list[dict]:
    """Runs on `node_id`: each (model, source) made local in this node's cache and pinned for the
    warm pool. A failure is reported, not raised: one bad source must not hide the others."""
    from hbmserve.weights.errors import WeightCacheError
    from hbmserve.weights.resolve import resolve

    spec = WeightCacheSpec.model_validate_json(cache_json)
    out = []
    for name, source in models:
        started = time.monotonic()
        try:
            got = resolve(source, spec, model=name, pin=True)
            got.release()  # the pin keeps it; the lease is for readers
            out.append(Prefetch(node_id=node_id, model=name, ok=True, hit=got.hit,
                                bytes_fetched=got.acquired.bytes_fetched, seconds=time.monotonic() - started))
        except (WeightCacheError, OSError) as err:
            out.append(Prefetch(node_id=node_id, model=name, ok=False, seconds=time.monotonic() - started,
                                error=f"{type(err).__name__}: {err}"))
    return [p.to_dict() for p in out]


class WarmTier:
    async def __init__(self, spec_json: str):
        self.spec = ClusterSpec.model_validate_json(spec_json)
        self.warm = [m for m in self.spec.models if warmable(self.spec, m)]
        self.shapes = {m.name: replica_shape(m) for m in self.warm}
        self.requested: tuple | None = None
        self.reason = ""
        self.seen: set[str] = set()
        self.pending: list = []  # prefetch tasks in flight
        self.prefetched: list[Prefetch] = []
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.tick)  # Ray calls block
            except Exception:  # noqa: BLE001 - a GCS hiccup must not end the loop; next tick retries
                log.warning("warm tier tick failed", exc_info=True)
            await asyncio.sleep(TICK_S)

    def tick(self) -> None:
        import ray
        from ray.autoscaler.sdk import request_resources

        now = time.time()
        request = cluster_request([wish_of(m) for m in self.spec.models])
        if request.bundles != self.requested:
            request_resources(bundles=[dict(b) for b in request.bundles])
            log.info("hbmserve warm tier: request_resources(%d bundles): %s", len(request.bundles), request.reason)
            self.requested, self.reason = request.bundles, request.reason
        for node in ray.nodes():
            if node.get("Alive") and node["NodeID"] not in self.seen:
                self.seen.add(node["NodeID"])
                self._prefetch_onto(node["NodeID"], node.get("Resources", {}))
        self._collect()
        publish_warm_tier(WarmTierRecord(
            at=now, node_autoscaler=node_autoscaler_running(now),
            warmable=tuple(engine_deployment_name(m) for m in self.warm),
            bundles=request.bundles, reason=request.reason, prefetched=tuple(self.prefetched)))

    def _prefetch_onto(self, node_id: str, resources: dict[str, float]) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        names = set(models_for_node(resources, self.shapes))
        models = [(m.name, m.source) for m in self.warm if m.name in names]
        if not models:
            return
        log.info("hbmserve warm tier: node %s joined; prefetching %s", node_id, ", ".join(n for n, _ in models))
        task = ray.remote(prefetch).options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
        self.pending.append(task.remote(node_id, models, self.spec.cache.model_dump_json()))

    def _collect(self) -> None:
        import ray

        if not self.pending:
            return
        done, self.pending = ray.wait(self.pending, num_returns=len(self.pending), timeout=0)
        for ref in done:
            try:
                results = [Prefetch.from_dict(p) for p in ray.get(ref)]
            except ray.exceptions.RayError as err:  # the node died under it, say
                log.warning("hbmserve warm tier: a prefetch failed: %s", err)
                continue
            for p in results:
                log.info("hbmserve warm tier: %s on %s: %s", p.model, p.node_id,
                         "ok" if p.ok else p.error)
            self.prefetched = (self.prefetched + results)[-KEEP_PREFETCHES:]

    def check_health(self) -> None:
        if self._task.done():
            raise RuntimeError("the warm tier loop ended")


def wants_warm_tier(spec: ClusterSpec) -> bool:
    return any(warmable(spec, m) for m in spec.models)
