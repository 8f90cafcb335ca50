"""A model's Serve replica: one engine and its private HTTP server, announced to the front doors.

Serve owns the replicas' lifecycle (placement, health checks, restarts, scaling); the app builder
(deployments/apps/) makes the deployment. Each replica serves HTTP itself on a private port and announces it
(deployments/wire/records_store.py); the front door on every node (deployments/ingress/) authenticates, admits and routes
each request to a replica with the shared `routing.choose`, and relays the bytes. Engines are
chosen through ENGINE_SERVERS, a registry keyed by `EngineKind`, of factories that build an
`EngineServer` (engine_server.py: the contract every engine server meets).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Callable

from hbmserve.capacity.perf.scenario import replica_usd_per_hour
from hbmserve.core.cache_spec import WeightCacheSpec
from hbmserve.core.config import ModelSpec
from hbmserve.core.engine_settings import EngineKind
from hbmserve.core.records import PlacementReport, ReplicaEndpoint, ReplicaInfo
from hbmserve.core.scaling import ReplicaState
from hbmserve.deployments.replica.engine_args import publishes_kv_events, vllm_launch
from hbmserve.deployments.replica.engine_server import EngineServer
from hbmserve.deployments.replica.replica_weights import local_weights
from hbmserve.deployments.replica.standby_sleep import StandbySleep
from hbmserve.routing.replica_cap import AdmissionBudget
from hbmserve.deployments.wire.autoscaling_stats import autoscaling_stats
from hbmserve.deployments.wire.engine_metrics import TPOT, TTFT, histogram_of
from hbmserve.deployments.wire.records_store import RENEW_S, info_reply, latest_decision, publish_endpoint, remove_endpoint

log = logging.getLogger("hbmserve.deployments.replica")


# A replica's own safety cap: the running batch plus a queue this many times its size. The
# front door's admission (routing/queue.py) is what clients meet; this only bounds what several
# front doors with lagging views could pile onto one replica.
QUEUE_SLOTS_PER_SEQ = 4


def replica_budget(model: ModelSpec) -> AdmissionBudget:
    return AdmissionBudget(max_in_flight=model.engine_settings.max_num_seqs * QUEUE_SLOTS_PER_SEQ)


def _vllm_server(model: ModelSpec, host: str, internal_token: str) -> EngineServer:
    from hbmserve.deployments.kv.engine_relay import EngineKvRelay
    from hbmserve.deployments.replica.vllm_server import VLLMHttpServer

    relay = EngineKvRelay() if publishes_kv_events(model) else None
    launch = vllm_launch(model, host, 0, relay.vllm_config() if relay else None)
    return VLLMHttpServer(launch, replica_budget(model), internal_token, kv_relay=relay,
                          adapters={a.name: a.source for a in model.adapters},
                          adapter_slots=model.lora.max_cpu_loras or model.lora.max_loras)


def _sim_server(model: ModelSpec, host: str, internal_token: str) -> EngineServer:
    from hbmserve.deployments.replica.sim_server import SimHttpServer

    return SimHttpServer(model, host, replica_budget(model), internal_token)


# (model, host, internal token) -> a server not yet started. Building one is cheap: the engine
# loads in `start()`.
EngineServerFactory = Callable[[ModelSpec, str, str], EngineServer]
ENGINE_SERVERS: dict[EngineKind, EngineServerFactory] = {
    EngineKind.VLLM_CPU: _vllm_server,
    EngineKind.VLLM_GPU: _vllm_server,
    EngineKind.SIM: _sim_server,
}


def replica_host(host: str) -> str:
    """Where a replica listens: the node's address when the front door listens on every
    interface (front doors on other nodes must reach it), else the configured host."""
    if host in ("0.0.0.0", "::"):
        import ray

        return ray.util.get_node_ip_address()
    return host


class EngineReplica:
    """A Serve replica that owns one engine and its private HTTP server, and announces the
    server's URL (records_store.publish_endpoint) for as long as it lives."""

    async def __init__(self, model_json: str, host: str, internal_token: str, cache_json: str | None = None,
                       role: str | None = None, *peers):
        """`role`: the pool of a disaggregated model it serves (the model is then that pool's,
        ModelSpec.pool); `peers`: other deployments of its application, bound so that Serve
        deploys them with it (deployments/apps/model_app.py), never called."""
        import ray
        from ray import serve

        self.model = ModelSpec.model_validate_json(model_json)
        started = time.monotonic()
        cache = WeightCacheSpec.model_validate_json(cache_json) if cache_json else WeightCacheSpec()
        # Held for the replica's life: the lease keeps the cache from evicting the engine's files.
        self.weights = await asyncio.to_thread(local_weights, self.model, cache)
        engine_model = self.weights.model if self.weights else self.model
        self.server: EngineServer = ENGINE_SERVERS[self.model.engine](engine_model, replica_host(host), internal_token)
        self.url = await self.server.start()
        # The warm start-up the policy plans with: weights already on the node, engine loaded.
        # A fill from the source on a miss is the cold tier's and is left out.
        fill_s = self.weights.seconds if self.weights and not self.weights.resolved.hit else 0.0
        self.load_s = time.monotonic() - started - fill_s
        self.usd_per_hour = replica_usd_per_hour(self.model)
        ctx = serve.get_replica_context()
        self.endpoint = ReplicaEndpoint(app=ctx.app_name, deployment=ctx.deployment,
                                        replica=ctx.replica_id.unique_id, model=self.model.name, url=self.url,
                                        node_id=ray.get_runtime_context().get_node_id(), at=time.time(),
                                        placement=self._placement(), kv_events=self.server.kv_events, role=role)
        await asyncio.to_thread(publish_endpoint, self.endpoint)
        loop = asyncio.get_running_loop()
        self._announce = loop.create_task(self._renew_endpoint())
        counters = self.server.counters
        self.standby_sleep = StandbySleep(self.server, self.server.awake, lambda: counters.in_flight,
                                          enabled=self.model.standbys_sleep)
        # Only a model whose standbys sleep follows its role continuously; others read it for info().
        self._sleep_loop = loop.create_task(self.standby_sleep.run(self._read_role)) \
            if self.model.standbys_sleep else None

    def _placement(self) -> PlacementReport | None:
        """Where this replica's ranks landed against its plan; None unless planned (placed_app.py)."""
        return None

    async def _renew_endpoint(self) -> None:
        while True:
            await asyncio.sleep(RENEW_S)
            try:
                renewed = ReplicaEndpoint(**{**self.endpoint.__dict__, "at": time.time()})
                await asyncio.to_thread(publish_endpoint, renewed)
            except Exception:  # noqa: BLE001 - a KV hiccup must not kill the replica; retry next time
                log.warning("could not renew this replica's endpoint", exc_info=True)

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Custom metrics for the autoscaling policy (deployments/control/autoscaling.py). Async: the
        engine's stats live on the replica's event loop, and Serve runs sync methods in threads."""
        now = time.monotonic()
        load = self.server.engine_stats()
        c = self.server.counters
        return autoscaling_stats(waiting=load.waiting, running=load.running, kv_usage=load.kv_usage,
                                 ttft_samples_s=c.ttft_samples(now), tpot_samples_s=c.tpot_samples(now),
                                 arrival_rps=c.arrival_rate(now), load_s=self.load_s,
                                 lengths=c.length_means(now), wake_s=self.standby_sleep.wake_s)

    def _role(self) -> ReplicaState:
        if self.model.autoscaling is None:
            return ReplicaState.ACTIVE
        decision = latest_decision(self.endpoint.app, self._decision_deployment())
        if decision is None or self.endpoint.replica in decision.active_replicas:
            return ReplicaState.ACTIVE
        return ReplicaState.STANDBY

    async def _read_role(self) -> ReplicaState:
        return await asyncio.to_thread(self._role)  # a Ray KV read: off the event loop

    def _decision_deployment(self) -> str:
        """Where the policy publishes the decision that names this replica's role."""
        return self.endpoint.deployment

    def _replica_info(self, role: ReplicaState) -> ReplicaInfo:
        c = self.server.counters
        load = self.server.engine_stats()
        families = self.server.engine_metrics()
        return ReplicaInfo(
            model=self.model.name,
            engine=self.model.engine.value,
            url=self.url,
            role=role,
            replica=self.endpoint.replica,
            node_id=self.endpoint.node_id,
            pid=os.getpid(),
            in_flight=c.in_flight,
            engine_waiting=load.waiting,
            engine_running=load.running,
            kv_usage=load.kv_usage,
            accepted=c.accepted,
            rejected=c.rejected,
            healthy=self.server.healthy(),
            load_s=self.load_s,
            weights_s=self.weights.seconds if self.weights else None,
            weights_cached=self.weights.resolved.hit if self.weights else None,
            prompt_tokens=load.prompt_tokens,
            prefix_hit_tokens=load.prefix_hit_tokens,
            ttft_histogram=histogram_of(families, TTFT),
            tpot_histogram=histogram_of(families, TPOT),
            slo_ttft_p95_s=self.model.slo.ttft_p95_ms / 1e3,
            slo_tpot_p95_s=self.model.slo.tpot_p95_ms / 1e3,
            usd_per_hour=self.usd_per_hour,
            sleeping=self.standby_sleep.sleeping,
            wake_s=self.standby_sleep.wake_s,
        )

    async def info(self) -> dict:
        """A ReplicaInfo as plain data (records_store.read_replica_info types it again)."""
        return info_reply(self._replica_info(await self._read_role()))

    async def check_health(self) -> None:
        if not self.server.healthy():
            raise RuntimeError(f"engine for {self.model.name} is not serving")
        if self.standby_sleep.failed:
            raise RuntimeError(f"engine for {self.model.name}: {self.standby_sleep.failed}")

    async def __del__(self) -> None:
        # Draining first: the front doors stop routing here but keep relaying its streams, which
        # end here or, past the drain timeout, move on by migration. The announcement is renewed
        # as draining through the drain and withdrawn once it is over.
        self.endpoint = ReplicaEndpoint(**{**self.endpoint.__dict__, "at": time.time(), "draining": True})
        await asyncio.to_thread(publish_endpoint, self.endpoint)
        # The sleep loop runs on through the drain: a request held while asleep still wakes it.
        await self.server.stop()
        self._announce.cancel()
        await asyncio.to_thread(remove_endpoint, self.endpoint)
        if self._sleep_loop is not None:
            self._sleep_loop.cancel()
        if self.weights:
            self.weights.release()
