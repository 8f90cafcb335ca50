"""Both engine servers meet the EngineServer Protocol (deployments/replica/engine_server.py), member by member.

`runtime_checkable` would only check that names exist; this compares each method's signature
(parameter names, kinds, defaults), async-ness and resolved type hints with the Protocol's,
and each attribute's type on a freshly built (not started) server. The checker is proven on
planted servers that each break the contract in one way.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import typing

import pytest
from prometheus_client.metrics_core import Metric

from hbmserve.core.records import KvEventsInfo
from hbmserve.core.config import ModelSpec
from hbmserve.core.engine_settings import EngineKind
from hbmserve.deployments.replica.engine_server import EngineServer
from hbmserve.deployments.replica.replica_middleware import LoadCounters
from hbmserve.deployments.replica.replica_http import AsgiListener, EngineLoad
from hbmserve.deployments.replica.engine_replica import ENGINE_SERVERS
from hbmserve.deployments.replica.sim_server import SimHttpServer
from hbmserve.deployments.replica.standby_sleep import AwakeGate
from hbmserve.deployments.replica.vllm_server import VLLMHttpServer


def protocol_methods(proto: type) -> dict[str, typing.Callable]:
    return {name: fn for name, fn in vars(proto).items() if inspect.isfunction(fn) and not name.startswith("_")}


def protocol_attributes(proto: type) -> dict[str, type]:
    methods = protocol_methods(proto)
    return {name: hint for name, hint in typing.get_type_hints(proto).items() if name not in methods}


def _shape(fn) -> tuple:
    params = [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]
    return params, inspect.iscoroutinefunction(fn), typing.get_type_hints(fn)


def mismatches(cls: type, instance: object, proto: type = EngineServer) -> list[str]:
    """Every way `cls` (and a built `instance`) differs from `proto`; empty when it conforms."""
    found = []
    for name, wanted in protocol_methods(proto).items():
        have = inspect.getattr_static(cls, name, None)
        if not inspect.isfunction(have):
            found.append(f"{cls.__name__}.{name}: missing")
            continue
        (w_params, w_async, w_hints), (h_params, h_async, h_hints) = _shape(wanted), _shape(have)
        if h_params != w_params:
            found.append(f"{cls.__name__}.{name}: parameters {h_params} != {w_params}")
        if h_async != w_async:
            found.append(f"{cls.__name__}.{name}: {'async' if h_async else 'sync'}, the Protocol's is not")
        if h_hints != w_hints:
            found.append(f"{cls.__name__}.{name}: types {h_hints} != {w_hints}")
    for name, hint in protocol_attributes(proto).items():
        if not isinstance(getattr(instance, name, None), hint):
            found.append(f"{cls.__name__}.{name}: not a {getattr(hint, '__name__', hint)} on a built server")
    return found


def sim_model() -> ModelSpec:
    return ModelSpec.model_validate({"name": "sim-8b", "source": "sim", "engine": "sim",
                                     "sim": {"gpu": "h100-sxm", "model_config_name": "llama-3.1-8b"}})


def vllm_model() -> ModelSpec:
    return ModelSpec.model_validate({"name": "tiny", "source": "/models/tiny", "engine": "vllm-cpu"})


def test_the_protocol_covers_what_the_replica_uses():
    assert set(protocol_methods(EngineServer)) == {"start", "stop", "sleep", "wake_up", "engine_stats",
                                                   "engine_metrics", "healthy"}
    assert protocol_attributes(EngineServer) == {"counters": LoadCounters, "listener": AsgiListener,
                                                 "awake": AwakeGate, "kv_events": KvEventsInfo | None}


@pytest.mark.parametrize("cls, model", [(VLLMHttpServer, vllm_model), (SimHttpServer, sim_model)],
                         ids=["vllm", "sim"])
def test_both_engine_servers_conform(cls, model):
    spec = model()
    server = ENGINE_SERVERS[spec.engine](spec, "127.0.0.1", "token")  # the factory the replica uses
    assert type(server) is cls
    assert mismatches(cls, server) == []


def test_every_registered_engine_builds_a_conforming_server():
    factories = {EngineKind.SIM: sim_model, EngineKind.VLLM_CPU: vllm_model, EngineKind.VLLM_GPU: vllm_model}
    assert set(ENGINE_SERVERS) == set(factories)
    for kind, factory in ENGINE_SERVERS.items():
        spec = factories[kind]().model_copy(update={"engine": kind})
        server = factory(spec, "127.0.0.1", "token")
        assert mismatches(type(server), server) == [], kind


class _Good:
    def __init__(self):
        self.counters, self.listener, self.awake = LoadCounters(), AsgiListener(), AwakeGate()
        self.kv_events = None

    async def start(self) -> str:
        return ""

    async def stop(self) -> None:
        pass

    async def sleep(self) -> None:
        pass

    async def wake_up(self) -> None:
        pass

    def engine_stats(self) -> EngineLoad:
        return EngineLoad(0, 0, 0.0)

    def engine_metrics(self) -> list[Metric]:
        return []

    def healthy(self) -> bool:
        return True


class _NewParameter(_Good):
    async def start(self, listen: bool) -> str:
        return ""


class _Blocking(_Good):
    def stop(self) -> None:
        pass


class _WrongType(_Good):
    def engine_stats(self) -> dict:
        return {}


class _Missing(_Good):
    healthy = None


class _NoCounters(_Good):
    def __init__(self):
        super().__init__()
        self.counters = {}


@pytest.mark.parametrize("cls, needle", [
    (_NewParameter, "start: parameters"), (_Blocking, "stop: sync"),
    (_WrongType, "engine_stats: types"), (_Missing, "healthy: missing"), (_NoCounters, "counters: not a"),
])
def test_the_check_catches_a_broken_server(cls, needle):
    assert mismatches(_Good, _Good()) == []
    problems = mismatches(cls, cls())
    assert any(needle in p for p in problems), problems


def test_importing_the_servers_and_building_one_loads_no_engine():
    """A replica's module imports, and `ENGINE_SERVERS[...]` builds, before any engine loads:
    vLLM (and torch, and Ray) are imported only in `start()`."""
    code = """
import json, sys, time
t = time.perf_counter()
import hbmserve.deployments.replica.vllm_server, hbmserve.deployments.replica.sim_server, hbmserve.deployments.apps.model_app
from hbmserve.core.config import ModelSpec
from hbmserve.deployments.replica.engine_replica import ENGINE_SERVERS
spec = ModelSpec.model_validate({"name": "tiny", "source": "/models/tiny", "engine": "vllm-cpu"})
ENGINE_SERVERS[spec.engine](spec, "127.0.0.1", "token")
print(json.dumps({"s": time.perf_counter() - t,
                  "loaded": sorted(m for m in ("vllm", "torch", "ray", "uvicorn") if m in sys.modules)}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["loaded"] == []
    assert result["s"] < 10  # seconds; an engine import alone takes longer on this machine
