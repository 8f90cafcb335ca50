"""The Ray Serve application: one deployment per model, each replica serving HTTP itself.

Serve owns the replicas' lifecycle (placement, health checks, restarts, scaling); the data path
goes straight to the replica's HTTP server (see vllm_server.py for why). Engines are chosen
through ENGINE_SERVERS, a registry keyed by `EngineKind`.
"""

from __future__ import annotations

import os
from typing import Callable

from hbmserve.cluster.config import ClusterSpec, EngineKind, ModelSpec
from hbmserve.deployments.admission import AdmissionBudget
from hbmserve.deployments.engine_args import vllm_launch


# Accepted requests beyond the engine's batch wait in the engine queue; past this many per
# running slot, queueing only adds TTFT, so the ingress refuses with 429 instead.
QUEUE_SLOTS_PER_SEQ = 4


def _vllm_server(model: ModelSpec, host: str, port: int, api_keys: frozenset[str]):
    from hbmserve.deployments.vllm_server import VLLMHttpServer

    budget = AdmissionBudget(max_in_flight=model.engine_settings.max_num_seqs * QUEUE_SLOTS_PER_SEQ)
    return VLLMHttpServer(vllm_launch(model, host, port), budget, api_keys)


# The simulated engine (capacity issue) plugs in here with the same server interface:
# `await start() -> url`, `await stop()`, `healthy()`, `counters`.
ENGINE_SERVERS: dict[EngineKind, Callable] = {
    EngineKind.VLLM_CPU: _vllm_server,
    EngineKind.VLLM_GPU: _vllm_server,
}


class EngineReplica:
    """A Serve replica that owns one engine and its HTTP server."""

    async def __init__(self, model_json: str, host: str, port: int, api_key_env: str | None):
        self.model = ModelSpec.model_validate_json(model_json)
        keys = os.environ.get(api_key_env, "") if api_key_env else ""
        api_keys = frozenset(k for k in keys.split(",") if k)
        self.server = ENGINE_SERVERS[self.model.engine](self.model, host, port, api_keys)
        self.url = await self.server.start()

    async def info(self) -> dict:
        import ray

        c = self.server.counters
        return {
            "model": self.model.name,
            "engine": self.model.engine.value,
            "url": self.url,
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "in_flight": c.in_flight,
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
    return [f"models.{i}.engine: '{m.engine.value}' is not available in this build (have: "
            f"{', '.join(k.value for k in ENGINE_SERVERS)})"
            for i, m in enumerate(spec.models) if m.engine not in ENGINE_SERVERS]


def actor_options(model: ModelSpec) -> dict:
    if model.engine is EngineKind.VLLM_CPU:
        # The engine core runs in its own process and takes the cores it needs; the replica
        # actor itself mostly waits on sockets.
        return {"num_cpus": 0}
    # GPU ranks beyond the first are placed by vLLM's Ray executor inside the replica's
    # placement group (see placement/ray_adapter.py); the replica holds one GPU itself.
    return {"num_cpus": 1, "num_gpus": 1 if model.parallelism.tp * model.parallelism.pp == 1 else 0}


def build_model_app(spec: ClusterSpec, model: ModelSpec, port: int):
    from ray import serve

    deployment = serve.deployment(
        EngineReplica,
        name=f"engine-{model.name}".replace("/", "-").replace(":", "-"),
        num_replicas=model.replicas,
        ray_actor_options=actor_options(model),
        health_check_period_s=10,
        health_check_timeout_s=30,
        graceful_shutdown_timeout_s=30,
    )
    return deployment.bind(model.model_dump_json(), spec.serve.http.host, port, spec.serve.api_key_env)


def model_ports(spec: ClusterSpec) -> dict[str, int]:
    """One port per model, counting up from serve.http.port; replicas share it (SO_REUSEPORT)."""
    return {m.name: spec.serve.http.port + i for i, m in enumerate(spec.models)}
