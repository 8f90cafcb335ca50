"""vLLM's own OpenAI server, run inside a Ray Serve replica on the replica's event loop.

Why not Serve's proxy: on a 2-core machine every extra hop (proxy actor, Ray RPC per streamed
chunk) takes CPU from the engine; Ray Serve LLM measured 0.31x of bare vLLM with defaults and
0.67x with direct streaming + HAProxy (docs/benchmarks.md). Here the replica serves HTTP itself through
vLLM's FastAPI app on a private port, and the front door (deployments/ingress/front_door.py) relays bytes to it:
one HTTP hop, no Ray RPC on the data path. Serve still owns the replica's life: placement,
health checks, restarts, scaling.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AsyncExitStack

from prometheus_client.metrics_core import Metric

from hbmserve.core.records import HASHING_VLLM, KvEventsInfo
from hbmserve.deployments.kv.engine_relay import EngineKvRelay
from hbmserve.deployments.kv.kv_stream import EVENTS_PATH, REPLAY_PATH, TOKENIZER_PATH
from hbmserve.deployments.kv.prompt_tokens import tokenizer_route
from hbmserve.routing.replica_cap import AdmissionBudget
from hbmserve.deployments.replica.engine_args import EngineLaunch
from hbmserve.deployments.wire.engine_metrics import engine_families
from hbmserve.deployments.replica.vllm_argv import parse_launch
from hbmserve.deployments.replica.replica_middleware import AdapterLoadError, AdapterRegistry, Load, LoadCounters, ReplicaMiddleware, Unload
from hbmserve.deployments.replica.replica_http import AsgiListener, EngineLoad
from hbmserve.deployments.replica.standby_sleep import AwakeGate

log = logging.getLogger("hbmserve.deployments.replica")


class VLLMHttpServer:
    """vLLM's engine and OpenAI app; an `EngineServer` (engine_server.py documents each method).
    vLLM is imported only in `start()`: building one (or importing this module) loads nothing."""

    def __init__(self, launch: EngineLaunch, budget: AdmissionBudget, internal_token: str,
                 kv_relay: EngineKvRelay | None = None, adapters: Mapping[str, str] | None = None,
                 adapter_slots: int = 0):
        """`adapters`: each LoRA adapter's local folder, registered in the engine on demand
        within `adapter_slots` (replica_middleware.py AdapterRegistry)."""
        self.launch = launch
        self.adapters, self.adapter_slots = dict(adapters or {}), adapter_slots
        self.kv_relay = kv_relay
        self.kv_events: KvEventsInfo | None = None
        self.budget = budget
        self.internal_token = internal_token
        self.counters = LoadCounters()
        self.engine_client = None
        self.url: str | None = None
        self._stack = AsyncExitStack()
        self.listener = AsgiListener()
        self.awake = AwakeGate()

    async def start(self) -> str:
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state
        from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client
        from vllm.entrypoints.launchers.app import build_app

        os.environ.update(dict(self.launch.env))
        # hbmserve's arguments plus engine_settings.vllm_args, parsed by vLLM's own parser (engine
        # and OpenAI-frontend arguments alike: one namespace serves both, as in `vllm serve`).
        args = parse_launch(self.launch)
        try:
            self.engine_client = await self._stack.enter_async_context(build_async_engine_client(args))
            tasks = await self.engine_client.get_supported_tasks()
            app = build_app(args, tasks, self.engine_client.model_config)
            await init_app_state(self.engine_client, app.state, args, tasks)
            # Listen only once the engine is loaded: the URL is announced to the front door
            # as soon as this returns, and traffic may follow at once.
            registry = (AdapterRegistry(self.adapters, self.adapter_slots,
                                        *vllm_adapter_calls(app.state.openai_serving_models)) if self.adapters else None)
            asgi = ReplicaMiddleware(app, self.budget, self.internal_token, self.counters, self.engine_stats,
                                     self.engine_metrics, self.awake, routes=self._kv_routes(args), adapters=registry)
            self.url = await self.listener.serve(asgi, args.host)
        except BaseException:
            await self._stack.aclose()
            raise
        log.info("serving %s on %s", args.served_model_name, self.url)
        return self.url

    def _kv_routes(self, args) -> dict:
        """The doors' KV paths: the event stream and replay (with events on) and the tokenizer
        they hash prompts with (deployments/kv/kv_stream.py, prompt_tokens.py)."""
        routes = {TOKENIZER_PATH: tokenizer_route(args.tokenizer or args.model)}
        if self.kv_relay is not None:
            block_size = self.engine_client.vllm_config.cache_config.block_size
            self.kv_events = KvEventsInfo(hashing=HASHING_VLLM, block_size=block_size)
            routes |= {EVENTS_PATH: self.kv_relay.events, REPLAY_PATH: self.kv_relay.replay}
        return routes

    async def stop(self) -> None:
        await self.listener.stop()
        await self._stack.aclose()
        if self.kv_relay is not None:
            self.kv_relay.close()

    # Sleep mode through the engine client the replica holds, in process: vLLM's /sleep and
    # /wake_up routes exist only in its dev mode (VLLM_SERVER_DEV_MODE) and would be one more
    # HTTP hop. The engine was started with --enable-sleep-mode (engine_args.vllm_launch).
    async def sleep(self) -> None:
        # vLLM's default pause mode aborts what is running; StandbySleep calls this only with
        # nothing in flight and new requests held at the gate, so nothing is aborted.
        await self.engine_client.sleep(level=1)

    async def wake_up(self) -> None:
        # True when every allocation is back on the device (the vLLM installed here); None is
        # taken as awake.
        if await self.engine_client.wake_up() is False:
            raise RuntimeError("vLLM woke only partly: some of its memory is still offloaded")

    def engine_stats(self) -> EngineLoad:
        """The engine's own queue, KV and prefix-cache figures, read from vLLM's in-process
        Prometheus registry."""
        from prometheus_client import REGISTRY

        return engine_load(load_samples(REGISTRY))

    def engine_metrics(self) -> list[Metric]:
        """vLLM's own families of engine_metrics.ENGINE_FAMILIES, from its in-process registry."""
        from prometheus_client import REGISTRY

        return engine_families(REGISTRY.collect())

    def healthy(self) -> bool:
        return self.listener.serving and not getattr(self.engine_client, "errored", False)


# vLLM's metric (sample) names, in EngineLoad's field order; counters carry prometheus_client's
# `_total` suffix.
_LOAD_SAMPLES = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")


def load_samples(registry) -> Iterator[tuple[str, float]]:
    """(name, value) of the samples engine_load reads, from the collectors of those families
    alone. The door asks each replica for its load ten times a second (replica_table.POLL_S), and
    collecting vLLM's whole registry, its histograms' every bucket, each time was 42% of an idle
    replica's py-spy samples, about 1.3% of a core (issue 22, docs/benchmarks.md). prometheus_client
    keeps its collectors by sample name in a private dict; without it, or before vLLM has
    registered every family, the whole registry is read as before."""
    by_name = getattr(registry, "_names_to_collectors", None)
    found = [by_name.get(n) for n in _LOAD_SAMPLES] if isinstance(by_name, dict) else [None]
    collectors = registry.collect() if None in found else (m for c in dict.fromkeys(found) for m in c.collect())
    for metric in collectors:
        for sample in metric.samples:
            yield sample.name, sample.value


def engine_load(samples: Iterable[tuple[str, float]]) -> EngineLoad:
    """Sum each figure over its samples (one per engine when vLLM runs data-parallel)."""
    got = dict.fromkeys(_LOAD_SAMPLES, 0.0)
    for name, value in samples:
        if name in got:
            got[name] += value
    waiting, running, kv, queries, hits = got.values()
    return EngineLoad(waiting=int(waiting), running=int(running), kv_usage=kv,
                      prompt_tokens=int(queries), prefix_hit_tokens=int(hits))


def vllm_adapter_calls(serving_models) -> tuple[Load, Unload]:
    """Load and unload through vLLM's OpenAIServingModels, the handlers of its
    /v1/load_lora_adapter and /v1/unload_lora_adapter routes."""
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse
    from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest

    async def load(name: str, path: str) -> None:
        out = await serving_models.load_lora_adapter(LoadLoRAAdapterRequest(lora_name=name, lora_path=path))
        if isinstance(out, ErrorResponse):
            raise AdapterLoadError(f"vLLM could not load adapter {name} from {path}: {out.error.message}")

    async def unload(name: str) -> None:
        out = await serving_models.unload_lora_adapter(UnloadLoRAAdapterRequest(lora_name=name))
        if isinstance(out, ErrorResponse):
            raise AdapterLoadError(f"vLLM could not unload adapter {name}: {out.error.message}")

    return load, unload
