"""The Ray Serve application: one deployment per model, each replica serving HTTP itself.

Serve owns the replicas' lifecycle (placement, health checks, restarts, scaling); the data path
goes straight to the replica's HTTP server (see vllm_server.py for why). Engines are chosen
through ENGINE_SERVERS, a registry keyed by `EngineKind`, of factories that build an
`EngineServer` (engine_server.py: the contract every engine server meets).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Callable

from hbmserve.access.keys import KeyRing
from hbmserve.core.config import AuthSpec, ClusterSpec, EngineKind, ModelSpec
from hbmserve.core.records import ReplicaInfo
from hbmserve.core.scaling import ReplicaState
from hbmserve.routing.admission import AdmissionBudget
from hbmserve.deployments.engine_args import vllm_launch
from hbmserve.deployments.engine_server import EngineServer
from hbmserve.deployments.records_store import info_reply, latest_decision

log = logging.getLogger("hbmserve.replica")


# Accepted requests beyond the engine's batch wait in the engine queue; past this many per
# running slot, queueing only adds TTFT, so the ingress refuses with 429 instead.
QUEUE_SLOTS_PER_SEQ = 4


def _budget(model: ModelSpec) -> AdmissionBudget:
    return AdmissionBudget(max_in_flight=model.engine_settings.max_num_seqs * QUEUE_SLOTS_PER_SEQ)


def _vllm_server(model: ModelSpec, host: str, port: int, keys: KeyRing | None) -> EngineServer:
    from hbmserve.deployments.vllm_server import VLLMHttpServer

    return VLLMHttpServer(vllm_launch(model, host, port), _budget(model), keys)


def _sim_server(model: ModelSpec, host: str, port: int, keys: KeyRing | None) -> EngineServer:
    from hbmserve.deployments.sim_server import SimHttpServer

    return SimHttpServer(model, host, port, _budget(model), keys)


# (model, host, port, keys or None for no auth) -> a server not yet started. Building one is
# cheap: the engine loads in `start()`.
EngineServerFactory = Callable[[ModelSpec, str, int, KeyRing | None], EngineServer]
ENGINE_SERVERS: dict[EngineKind, EngineServerFactory] = {
    EngineKind.VLLM_CPU: _vllm_server,
    EngineKind.VLLM_GPU: _vllm_server,
    EngineKind.SIM: _sim_server,
}


# How often an autoscaled replica re-reads its role; promotion latency is at most this plus
# one Serve control-loop tick.
ROLE_POLL_S = 0.2


class EngineReplica:
    """A Serve replica that owns one engine and its HTTP server.

    An autoscaled replica follows the role the policy assigns it (autoscale/roles.py): active
    replicas listen on the model's port, hot standbys keep the engine loaded without listening.
    """

    async def __init__(self, model_json: str, host: str, port: int, auth: AuthSpec | None):
        from hbmserve.deployments.ingress_middleware import load_key_ring

        self.model = ModelSpec.model_validate_json(model_json)
        self.host = host
        keys = load_key_ring(auth)  # raises when the files cannot be used: no replica without its keys
        self.server: EngineServer = ENGINE_SERVERS[self.model.engine](self.model, host, port, keys)
        self._roles: asyncio.Task | None = None
        started = time.monotonic()
        if self.model.autoscaling is None:
            self.url = await self.server.start()
            self.load_s = time.monotonic() - started
            return
        from ray import serve

        ctx = serve.get_replica_context()
        self._me = (ctx.app_name, ctx.deployment, ctx.replica_id.unique_id)
        self.url = await self.server.start(listen=await asyncio.to_thread(self._assigned_active))
        self.load_s = time.monotonic() - started  # the warm start-up the policy plans with
        self._roles = asyncio.get_running_loop().create_task(self._follow_roles())

    def _assigned_active(self) -> bool:
        """Blocking (Ray internal KV). Before the policy's first decision every replica serves."""
        app, deployment, me = self._me
        decision = latest_decision(app, deployment)
        return decision is None or me in decision.active_replicas

    async def _follow_roles(self) -> None:
        listener = self.server.listener
        while True:
            await asyncio.sleep(ROLE_POLL_S)
            try:
                active = await asyncio.to_thread(self._assigned_active)
                if active and not listener.serving:
                    await listener.resume()
                    log.info("promoted: serving %s on %s", self.model.name, self.url)
                elif not active and listener.serving:
                    listener.pause()
                    log.info("standby: %s out of rotation, in-flight requests finishing", self.model.name)
            except Exception:  # noqa: BLE001 - a KV hiccup must not kill the replica; retry next poll
                log.warning("could not follow the autoscaler's role assignment", exc_info=True)

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Custom metrics for the autoscaling policy (deployments/autoscaling.py). Async: the
        engine's stats live on the replica's event loop, and Serve runs sync methods in threads."""
        from hbmserve.deployments.autoscaling import autoscaling_stats

        now = time.monotonic()
        load = self.server.engine_stats()
        c = self.server.counters
        return autoscaling_stats(waiting=load.waiting, running=load.running, kv_usage=load.kv_usage,
                                 ttft_samples_s=c.ttft_samples(now), tpot_samples_s=c.tpot_samples(now),
                                 arrival_rps=c.arrival_rate(now), load_s=self.load_s)

    def _replica_info(self) -> ReplicaInfo:
        import ray
        from ray import serve

        c = self.server.counters
        load = self.server.engine_stats()
        private = self.server.listener.private_url
        if private and self.host in ("0.0.0.0", "::"):
            private = private.replace(self.host, ray.util.get_node_ip_address(), 1)
        return ReplicaInfo(
            model=self.model.name,
            engine=self.model.engine.value,
            url=self.url,
            private_url=private,
            role=ReplicaState.ACTIVE if self.server.listener.serving else ReplicaState.STANDBY,
            replica=serve.get_replica_context().replica_id.unique_id,
            node_id=ray.get_runtime_context().get_node_id(),
            pid=os.getpid(),
            in_flight=c.in_flight,
            engine_waiting=load.waiting,
            engine_running=load.running,
            kv_usage=load.kv_usage,
            accepted=c.accepted,
            rejected=c.rejected,
            healthy=self.server.healthy(),
            load_s=self.load_s,
        )

    async def info(self) -> dict:
        """A ReplicaInfo as plain data (records_store.read_replica_info types it again)."""
        return info_reply(self._replica_info())

    async def check_health(self) -> None:
        if not self.server.healthy():
            raise RuntimeError(f"engine for {self.model.name} is not serving")

    async def __del__(self) -> None:
        if self._roles is not None:
            self._roles.cancel()
        await self.server.stop()


def unsupported_engines(spec: ClusterSpec) -> list[str]:
    problems = [f"models.{i}.engine: '{m.engine.value}' is not available in this build (have: "
                f"{', '.join(k.value for k in ENGINE_SERVERS)})"
                for i, m in enumerate(spec.models) if m.engine not in ENGINE_SERVERS]
    return problems + _sim_scenario_problems(spec)


def _sim_scenario_problems(spec: ClusterSpec) -> list[str]:
    """A simulated model that cannot be simulated (unknown GPU or shape, does not fit) fails here,
    before deploying, rather than as a replica constructor crash-looping in Serve."""
    sims = [m for m in spec.models if m.engine is EngineKind.SIM]
    if not sims:
        return []
    from hbmserve.capacity.hardware import CatalogError, load_catalog
    from hbmserve.capacity.model_shape import ModelConfigError
    from hbmserve.capacity.scenario import ScenarioError, scenario_for

    catalog, problems = load_catalog(), []
    for m in sims:
        try:
            scenario_for(m, catalog)
        except (ScenarioError, ModelConfigError, CatalogError) as err:
            msg = str(err)
            problems.append(msg if msg.startswith("models.") else f"models.{m.name}.sim: {msg}")
    return problems


def actor_options(model: ModelSpec) -> dict:
    if model.engine is EngineKind.SIM:
        # The simulated engine is a few coroutines on the replica's event loop, mostly asleep:
        # tens of replicas must fit on two cores, and it holds no GPU unless asked to.
        gpus = model.parallelism.tp * model.parallelism.pp if model.sim.reserve_gpus else 0
        return {"num_cpus": 0, "num_gpus": gpus} if gpus else {"num_cpus": 0}
    if model.engine is EngineKind.VLLM_CPU:
        # The engine core runs in its own process and takes the cores it needs; the replica
        # actor itself mostly waits on sockets.
        return {"num_cpus": 0}
    # GPU ranks beyond the first are placed by vLLM's Ray executor inside the replica's
    # placement group (see placement/ray_adapter.py); the replica holds one GPU itself.
    return {"num_cpus": 1, "num_gpus": 1 if model.parallelism.tp * model.parallelism.pp == 1 else 0}


def scaling_options(model: ModelSpec) -> dict:
    """Fixed `replicas`, or Serve autoscaling driven by hbmserve's policy (autoscale/)."""
    from hbmserve.autoscale.config import autoscale_config_for
    from hbmserve.deployments.autoscaling import serve_autoscaling_config

    config = autoscale_config_for(model)
    if config is None:
        return {"num_replicas": model.replicas}
    return {"autoscaling_config": serve_autoscaling_config(config)}


def engine_deployment_name(model: ModelSpec) -> str:
    return f"engine-{model.name}".replace("/", "-").replace(":", "-")


def build_model_app(spec: ClusterSpec, model: ModelSpec, port: int):
    """The model's Serve application: its engine deployment, fronted by a gate (gate.py) when
    the model may scale to zero."""
    from ray import serve

    from hbmserve.deployments.replica_http import DRAIN_TIMEOUT_S

    name = engine_deployment_name(model)
    deployment = serve.deployment(
        EngineReplica,
        name=name,
        ray_actor_options=actor_options(model),
        health_check_period_s=10,
        health_check_timeout_s=30,
        # Past this Serve kills the replica; the replica's own drain must finish first.
        graceful_shutdown_timeout_s=DRAIN_TIMEOUT_S + 10,
        **scaling_options(model),
    )
    args = (model.model_dump_json(), spec.serve.http.host, port, spec.serve.auth)
    engine = deployment.bind(*args)
    if model.autoscaling is None or model.autoscaling.min_replicas > 0:
        return engine
    from hbmserve.deployments.gate import ModelGate

    gate = serve.deployment(ModelGate, name=f"gate-{name.removeprefix('engine-')}", num_replicas=1,
                            ray_actor_options={"num_cpus": 0},
                            graceful_shutdown_timeout_s=model.autoscaling.scale_from_zero_wait_s + 10)
    return gate.bind(*args, engine, name, _budget(model).max_in_flight)


def model_ports(spec: ClusterSpec) -> dict[str, int]:
    """One port per model, counting up from serve.http.port; replicas share it (SO_REUSEPORT)."""
    return {m.name: spec.serve.http.port + i for i, m in enumerate(spec.models)}
