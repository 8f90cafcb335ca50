"""Sleep mode on the simulated engine's real server (uvicorn on loopback, the replica middleware):
a standby sleeps, a promotion wakes it after the start-up timeline's wake, and a request that
arrives meanwhile is held and answered, not dropped. No Ray: the role comes from a callable, as
the replica's would from the policy's decision."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from hbmserve.capacity.perf.hardware import get_gpu
from hbmserve.capacity.perf.startup_measured import startup_inputs_for
from hbmserve.core.config import ModelSpec
from hbmserve.core.scaling import ReplicaState
from hbmserve.deployments.replica.engine_replica import replica_budget
from hbmserve.deployments.replica.sim_server import SimHttpServer, sim_wake_s
from hbmserve.deployments.replica.standby_sleep import StandbySleep

SPEEDUP = 5.0
FRONT_DOOR = {"x-hbmserve-internal": "token"}
BODY = {"model": "sim-8b", "prompt": "hi", "max_tokens": 2}


def model(sleep: bool = True) -> ModelSpec:
    return ModelSpec.model_validate({
        "name": "sim-8b", "source": "sim", "engine": "sim",
        "engine_settings": {"max_model_len": 2048, "max_num_seqs": 8},
        "autoscaling": {"min_replicas": 1, "max_replicas": 2, "hot_standby": {"max": 1, "sleep": sleep}},
        "sim": {"gpu": "h100-sxm", "model_config_name": "llama-3.1-8b", "speedup": SPEEDUP}})


def test_the_simulated_wake_is_the_timelines_at_the_engines_speedup():
    inputs = startup_inputs_for(model(), get_gpu("h100-sxm"))
    # 8B in bf16 back over the H100's host link, plus the wake's fixed part (startup_timeline.py).
    expected = inputs.weights_bytes / (inputs.wake_gbps * 1e9) + inputs.wake_fixed_s
    assert sim_wake_s(model(), get_gpu("h100-sxm")) == pytest.approx(expected / SPEEDUP)
    assert 0.1 < expected / SPEEDUP < 1.0  # short enough for this test, long enough to see


async def until(predicate, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def test_standby_sleeps_promotion_wakes_after_the_delay_and_a_request_meanwhile_is_answered():
    role = [ReplicaState.STANDBY]

    async def read_role():
        return role[0]

    async def go():
        server = SimHttpServer(model(), "127.0.0.1", replica_budget(model()), "token")
        url = await server.start()
        wake = server.wake_delay_s
        sleeper = StandbySleep(server, server.awake, lambda: server.counters.in_flight, enabled=True)
        loop = asyncio.get_running_loop()
        task = loop.create_task(sleeper.run(read_role, period_s=0.05))
        try:
            async with httpx.AsyncClient(base_url=url, timeout=10) as c:
                await until(lambda: sleeper.sleeping)  # a standby with nothing in flight sleeps
                # Promotion: the front door routes as soon as the decision lists the replica
                # active, maybe before the replica has read it.
                role[0] = ReplicaState.ACTIVE
                t0 = loop.time()
                promoted = await c.post("/v1/completions", headers=FRONT_DOOR, json=BODY)
                promoted_s = loop.time() - t0
                first_wake = sleeper.wake_s
                # Demoted again: it sleeps once idle. A front door with a stale view still sends
                # it a request: answered after a wake, then it sleeps again.
                role[0] = ReplicaState.STANDBY
                await until(lambda: sleeper.sleeping)
                stale = await c.post("/v1/completions", headers=FRONT_DOOR, json=BODY)
                await until(lambda: sleeper.sleeping)
                # Awake and active, a request passes at once.
                role[0] = ReplicaState.ACTIVE
                await until(lambda: not sleeper.sleeping)
                t0 = loop.time()
                awake = await c.post("/v1/completions", headers=FRONT_DOOR, json=BODY)
                awake_s = loop.time() - t0
            return wake, promoted, promoted_s, first_wake, stale, awake, awake_s, server.counters
        finally:
            task.cancel()
            await server.stop()

    wake, promoted, promoted_s, first_wake, stale, awake, awake_s, counters = \
        asyncio.run(asyncio.wait_for(go(), timeout=30))
    assert wake == pytest.approx(sim_wake_s(model(), get_gpu("h100-sxm")))
    assert promoted.status_code == 200 and promoted.json()["usage"]["completion_tokens"] == 2
    assert promoted_s >= 0.99 * wake  # held for the whole wake, then answered
    assert wake <= first_wake < wake + 0.2  # the wake the replica measured and reports
    assert stale.status_code == 200
    assert awake.status_code == 200 and awake_s < wake  # no wake left to wait for
    assert (counters.accepted, counters.rejected, counters.in_flight) == (3, 0, 0)


def test_without_sleep_mode_the_simulated_standby_stays_loaded():
    async def go():
        server = SimHttpServer(model(sleep=False), "127.0.0.1", replica_budget(model(False)), "token")
        await server.start()
        try:
            sleeper = StandbySleep(server, server.awake, lambda: 0, enabled=False)
            step = await sleeper.step(ReplicaState.STANDBY)
            return step, sleeper.sleeping, server.wake_delay_s
        finally:
            await server.stop()

    step, sleeping, delay = asyncio.run(go())
    assert (step.action.value, sleeping, delay) == ("stay", False, 0.0)
