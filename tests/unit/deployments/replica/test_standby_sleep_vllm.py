"""The live sleep driver (deployments/replica/standby_sleep.py) on vLLM's server, with a fake engine
client that records what it is asked: no vLLM engine, no GPU, no Ray."""

from __future__ import annotations

import asyncio

import pytest

from hbmserve.core.config import ModelSpec, parse_cluster_spec
from hbmserve.core.scaling import ReplicaState
from hbmserve.deployments.replica.engine_args import vllm_launch
from hbmserve.deployments.replica.engine_replica import ENGINE_SERVERS
from hbmserve.deployments.apps.model_app import unsupported_engines
from hbmserve.deployments.replica.standby_sleep import AwakeGate, StandbySleep
from hbmserve.deployments.replica.vllm_server import VLLMHttpServer

ACTIVE, STANDBY = ReplicaState.ACTIVE, ReplicaState.STANDBY
WAKE_S = 0.05  # the fake engine's wake


class FakeEngineClient:
    """vLLM's EngineClient as far as sleep mode goes (vllm/engine/protocol.py)."""

    def __init__(self, fully_awake: bool = True, sleep_error: Exception | None = None):
        self.calls: list[tuple] = []
        self.fully_awake, self.sleep_error = fully_awake, sleep_error
        self.asleep = False

    async def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self.calls.append(("sleep", level))
        if self.sleep_error:
            raise self.sleep_error
        self.asleep = True

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        self.calls.append(("wake_up", tags))
        await asyncio.sleep(WAKE_S)
        self.asleep = not self.fully_awake
        return self.fully_awake

    async def is_sleeping(self) -> bool:
        return self.asleep


def gpu_model(sleep: bool = True) -> ModelSpec:
    return ModelSpec.model_validate({
        "name": "big", "source": "/models/big", "engine": "vllm-gpu", "hardware": {"gpu": "h100-sxm"},
        "autoscaling": {"min_replicas": 1, "max_replicas": 3, "hot_standby": {"max": 1, "sleep": sleep}}})


def driven(client: FakeEngineClient, in_flight: list[int] | None = None) -> tuple[StandbySleep, VLLMHttpServer]:
    server = ENGINE_SERVERS[gpu_model().engine](gpu_model(), "127.0.0.1", "token")  # the replica's factory
    assert isinstance(server, VLLMHttpServer)
    server.engine_client = client  # what start() would have built
    count = in_flight if in_flight is not None else [0]
    return StandbySleep(server, server.awake, lambda: count[0], enabled=True), server


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=10))


def test_a_standby_sleeps_at_level_1_and_a_promotion_wakes_it_once():
    client = FakeEngineClient()
    sleeper, server = driven(client)

    async def go():
        await sleeper.step(STANDBY)
        asleep = (sleeper.sleeping, server.awake.is_open)
        await sleeper.step(STANDBY)  # already asleep: nothing more
        await sleeper.step(ACTIVE)
        await sleeper.step(ACTIVE)  # already awake: nothing more
        return asleep

    assert run(go()) == (True, False)
    assert client.calls == [("sleep", 1), ("wake_up", None)]
    assert (sleeper.sleeping, server.awake.is_open) == (False, True)
    assert WAKE_S <= sleeper.wake_s < WAKE_S + 0.5  # timed from wake_up() called to done


def test_a_demoted_replica_drains_before_it_sleeps():
    client, in_flight = FakeEngineClient(), [2]
    sleeper, _ = driven(client, in_flight)

    async def go():
        step = await sleeper.step(STANDBY)
        in_flight[0] = 0
        await sleeper.step(STANDBY)
        return step

    assert "draining 2" in run(go()).reason
    assert client.calls == [("sleep", 1)]  # only once the last request finished


def test_a_request_at_a_sleeping_replica_is_held_until_it_is_awake():
    client, in_flight = FakeEngineClient(), [0]
    sleeper, server = driven(client, in_flight)
    order: list[str] = []

    async def request():
        in_flight[0] += 1  # the middleware counts it in flight before the gate
        await server.awake.pass_through()
        order.append("request passes" if not client.asleep else "request reached a sleeping engine")

    async def go():
        await sleeper.step(STANDBY)
        held = asyncio.get_running_loop().create_task(request())
        await asyncio.sleep(0.05)
        assert not held.done()  # held, not refused
        # The front door routed here on the new decision before the replica read it; the
        # replica's loop, nudged by the gate, wakes the engine whatever the role it read.
        await sleeper.step(STANDBY)
        order.append("woken")
        await held

    run(go())
    assert order == ["woken", "request passes"]  # answered once awake: not dropped, not early
    assert client.calls == [("sleep", 1), ("wake_up", None)]


def test_the_loop_wakes_at_once_for_a_held_request_not_at_its_next_tick():
    client, in_flight = FakeEngineClient(), [0]
    sleeper, server = driven(client, in_flight)
    role = [STANDBY]

    async def read_role():
        return role[0]

    async def go():
        loop = asyncio.get_running_loop()
        task = loop.create_task(sleeper.run(read_role, period_s=60.0))
        for _ in range(100):
            if sleeper.sleeping:
                break
            await asyncio.sleep(0.01)
        assert sleeper.sleeping
        role[0] = ACTIVE  # promoted; the loop would not look again for 60 s
        in_flight[0] += 1
        t0 = loop.time()
        await server.awake.pass_through()
        waited = loop.time() - t0
        task.cancel()
        return waited

    waited = run(go())
    assert WAKE_S <= waited < 1.0
    assert client.calls == [("sleep", 1), ("wake_up", None)]


def test_an_engine_that_cannot_sleep_stays_a_loaded_standby():
    client = FakeEngineClient(sleep_error=ValueError("Sleep mode is not supported on current platform."))
    sleeper, server = driven(client)
    run(sleeper.step(STANDBY))
    run(sleeper.step(STANDBY))
    assert client.calls == [("sleep", 1)]  # tried once, then sleep mode is off for this replica
    assert (sleeper.sleeping, sleeper.enabled, server.awake.is_open) == (False, False, True)


def test_a_partial_wake_fails_the_replica_and_frees_the_held_requests():
    client = FakeEngineClient(fully_awake=False)
    sleeper, server = driven(client)
    run(sleeper.step(STANDBY))
    run(sleeper.step(ACTIVE))
    assert sleeper.failed and "woke only partly" in sleeper.failed
    assert server.awake.is_open  # the held requests meet the engine's error rather than hang


def test_vllm_gpu_starts_able_to_sleep_only_when_its_standbys_sleep():
    assert "--enable-sleep-mode" in vllm_launch(gpu_model(sleep=True), "127.0.0.1", 0).cli_args
    assert "--enable-sleep-mode" not in vllm_launch(gpu_model(sleep=False), "127.0.0.1", 0).cli_args


@pytest.mark.parametrize("engine", ["vllm-gpu", "sim"])
def test_deploy_accepts_sleeping_standbys_where_the_engine_can_sleep(engine):
    spec = parse_cluster_spec({"name": "c", "models": [
        {"name": "m", "source": "/x", "engine": engine, "hardware": {"gpu": "h100-sxm"},
         "autoscaling": {"hot_standby": {"max": 1, "sleep": True}}}]})
    assert spec.models[0].standbys_sleep
    assert not any("sleep" in p for p in unsupported_engines(spec))


def test_the_gate_is_open_until_closed():
    gate = AwakeGate()
    run(gate.pass_through())  # returns at once
    gate.close()
    assert not gate.is_open
