"""The Ray Serve application: one deployment per model, each replica serving HTTP itself.

Serve owns the replicas' lifecycle (placement, health checks, restarts, scaling); the data path
goes straight to the replica's HTTP server (see vllm_server.py for why). Engines are chosen
through ENGINE_SERVERS, a registry keyed by `EngineKind`.
"""

from __future__ import annotations

import os
import time
from typing import Callable

from hbmserve.cluster.config import ClusterSpec, EngineKind, ModelSpec
from hbmserve.deployments.admission import AdmissionBudget
from hbmserve.deployments.engine_args import vllm_launch


# Accepted requests beyond the engine's batch wait in the engine queue; past this many per
# running slot, queueing only adds TTFT, so the ingress refuses with 429 instead.
QUEUE_SLOTS_PER_SEQ = 4


def _budget(model: ModelSpec) -> AdmissionBudget:
    return AdmissionBudget(max_in_flight=model.engine_settings.max_num_seqs * QUEUE_SLOTS_PER_SEQ)


def _vllm_server(model: ModelSpec, host: str, port: int, api_keys: frozenset[str]):
    from hbmserve.deployments.vllm_server import VLLMHttpServer

    return VLLMHttpServer(vllm_launch(model, host, port), _budget(model), api_keys)


def _sim_server(model: ModelSpec, host: str, port: int, api_keys: frozenset[str]):
    from hbmserve.deployments.sim_server import SimHttpServer

    return SimHttpServer(model, host, port, _budget(model), api_keys)


# Every engine server has the same interface: `await start() -> url`, `await stop()`,
# `healthy()`, `counters` (LoadCounters), `engine_stats() -> EngineLoad`.
ENGINE_SERVERS: dict[EngineKind, Callable] = {
    EngineKind.VLLM_CPU: _vllm_server,
    EngineKind.VLLM_GPU: _vllm_server,
    EngineKind.SIM: _sim_server,
}


class EngineReplica:
    """A Serve replica that owns one engine and its HTTP server."""

    async def __init__(self, model_json: str, host: str, port: int, api_key_env: str | None):
        self.model = ModelSpec.model_validate_json(model_json)
        keys = os.environ.get(api_key_env, "") if api_key_env else ""
        api_keys = frozenset(k for k in keys.split(",") if k)
        self.server = ENGINE_SERVERS[self.model.engine](self.model, host, port, api_keys)
        self.url = await self.server.start()

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Custom metrics for the autoscaling policy (autoscale/serve_adapter.py). Async: the
        engine's stats live on the replica's event loop, and Serve runs sync methods in threads."""
        from hbmserve.autoscale.serve_adapter import autoscaling_stats

        now = time.monotonic()
        load = self.server.engine_stats()
        c = self.server.counters
        return autoscaling_stats(waiting=load.waiting, running=load.running, kv_usage=load.kv_usage,
                                 ttft_samples_s=c.ttft_samples(now), arrival_rps=c.arrival_rate(now),
                                 standby=False)

    async def info(self) -> dict:
        import ray

        c = self.server.counters
        load = self.server.engine_stats()
        return {
            "model": self.model.name,
            "engine": self.model.engine.value,
            "url": self.url,
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "in_flight": c.in_flight,
            "engine_waiting": load.waiting,
            "engine_running": load.running,
            "kv_usage": load.kv_usage,
            "accepted": c.accepted,
            "rejected": c.rejected,
            "healthy": self.server.healthy(),
        }

    async def check_health(self) -> None:
        if not self.server.healthy():
            raise RuntimeError(f"engine for {self.model.name} is not serving")

    async def __del__(self) -> None:
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
    from hbmserve.autoscale.from_spec import autoscale_config_for
    from hbmserve.autoscale.serve_adapter import serve_autoscaling_config

    config = autoscale_config_for(model)
    if config is None:
        return {"num_replicas": model.replicas}
    return {"autoscaling_config": serve_autoscaling_config(config)}


def build_model_app(spec: ClusterSpec, model: ModelSpec, port: int):
    from ray import serve

    from hbmserve.deployments.replica_http import DRAIN_TIMEOUT_S

    deployment = serve.deployment(
        EngineReplica,
        name=f"engine-{model.name}".replace("/", "-").replace(":", "-"),
        ray_actor_options=actor_options(model),
        health_check_period_s=10,
        health_check_timeout_s=30,
        # Past this Serve kills the replica; the replica's own drain must finish first.
        graceful_shutdown_timeout_s=DRAIN_TIMEOUT_S + 10,
        **scaling_options(model),
    )
    return deployment.bind(model.model_dump_json(), spec.serve.http.host, port, spec.serve.api_key_env)


def model_ports(spec: ClusterSpec) -> dict[str, int]:
    """One port per model, counting up from serve.http.port; replicas share it (SO_REUSEPORT)."""
    return {m.name: spec.serve.http.port + i for i, m in enumerate(spec.models)}
