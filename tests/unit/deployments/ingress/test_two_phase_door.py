"""A disaggregated model through the front door's ASGI app, in process (issue 23 req 2): real
simulated-engine servers on loopback as its prefill and decode pools (no Ray). The client sees
one ordinary reply; the prompt runs on a prefill replica and the reply on a decode replica that
loads the KV; a dead prefill replica is retried, a dead decode replica too, and what cannot run
in two phases runs aggregated rather than fails."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import httpx
import pytest

from hbmserve.core.config import parse_cluster_spec
from hbmserve.core.disagg_spec import Role
from hbmserve.core.records import ReplicaEndpoint
from hbmserve.deployments.ingress.front_door_access import AccessGuard
from hbmserve.deployments.ingress.front_door_app import FrontDoorApp
from hbmserve.deployments.ingress.front_door_queue import ModelAdmission
from hbmserve.deployments.ingress.replica_table import ReplicaTable
from hbmserve.deployments.ingress.request_body import BodyLimits
from hbmserve.deployments.replica.engine_replica import replica_budget
from hbmserve.deployments.replica.sim_server import SimHttpServer
from tests.unit.deployments.ingress.test_front_door_app import _closed_port

TOKEN = "internal"
SPEC = parse_cluster_spec({"models": [{
    "name": "m", "source": "sim", "engine": "sim",
    "sim": {"gpu": "h100-sxm", "model_config_name": "llama-3.1-8b", "speedup": 200.0},
    "engine_settings": {"max_model_len": 2048, "max_num_seqs": 4},
    "disaggregation": {"prefill": {"replicas": 2}, "decode": {"replicas": 2}, "connector": "sim"}}]})
PROMPT = "the model and its cache live in HBM, which is small, expensive and slow to fill. " * 8


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


class Pools:
    """`prefill` and `decode` live sim replicas of each pool, `dead_*` closed ports announced."""

    def __init__(self, prefill: int = 2, decode: int = 2, dead_prefill: int = 0, dead_decode: int = 0):
        self.counts = {Role.PREFILL: (prefill, dead_prefill), Role.DECODE: (decode, dead_decode)}

    async def __aenter__(self):
        model = SPEC.model("m")
        self.servers: dict[Role, list[SimHttpServer]] = {}
        eps = []
        for role, (live, dead) in self.counts.items():
            pool = model.pool(role)
            self.servers[role] = [SimHttpServer(pool, "127.0.0.1", replica_budget(pool), TOKEN) for _ in range(live)]
            # The dead first: a replica that looks idle but is gone is what retries are for.
            urls = [f"http://127.0.0.1:{_closed_port()}" for _ in range(dead)]
            urls += [await s.start() for s in self.servers[role]]
            eps += [ReplicaEndpoint(app="m", deployment=f"engine-m-{role.value}", replica=f"{role.value[0]}{i}",
                                    model="m", url=u, node_id="n", at=0.0, role=role.value)
                    for i, u in enumerate(urls)]
        self.table = ReplicaTable(["m"], set())
        self.table.update(eps, {})
        self.session = aiohttp.ClientSession()
        admission = {"m": ModelAdmission(model.serving(), self.table)}
        self.app = FrontDoorApp(SPEC, self.table, AccessGuard(None), admission, lambda: self.session, TOKEN,
                                BodyLimits())
        await self.table.poll(self.app.upstream, TOKEN)
        for r in self.table.replicas["m"].values():  # the dead look alive until a request finds them
            r.reachable = True
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://door",
                                        timeout=30)
        return self

    def accepted(self, role: Role) -> list[int]:
        return [s.counters.accepted for s in self.servers[role]]

    def kv_loaded(self) -> float:
        return sum(s.metrics.external_hits._value.get() for s in self.servers[Role.DECODE])

    def outcomes(self) -> dict[str, int]:
        return dict(self.app.two_phase.outcomes.get("m", {}))

    async def __aexit__(self, *exc):
        await self.client.aclose()
        await self.session.close()
        for servers in self.servers.values():
            for s in servers:
                await s.stop()


async def _stream(client, **extra) -> tuple[str, list[dict], str]:
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 12, "stream": True,
            "stream_options": {"include_usage": True}, **extra}
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        events = [line.removeprefix("data: ") async for line in resp.aiter_lines() if line.startswith("data: ")]
        replica = resp.headers["x-hbmserve-replica"]
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    assert events[-1] == "[DONE]"
    return "".join(c["choices"][0]["text"] for c in chunks if c["choices"]), chunks, replica


def test_the_prompt_runs_on_a_prefill_replica_and_the_stream_on_a_decode_replica_that_loads_its_kv():
    async def go():
        async with Pools() as p:
            streams = await asyncio.gather(*(_stream(p.client) for _ in range(6)))
            whole = await p.client.post("/v1/completions", json={"model": "m", "prompt": PROMPT, "max_tokens": 12})
            return streams, whole.json(), p.accepted(Role.PREFILL), p.accepted(Role.DECODE), p.kv_loaded(), \
                p.outcomes()

    streams, whole, prefilled, decoded, loaded, outcomes = run(go())
    assert sum(prefilled) == 7 and sum(decoded) == 7, "each request: one prefill, one decode"
    assert all(replica.startswith("d") for _, _, replica in streams), "the reply comes from the decode pool"
    texts = {text for text, _, _ in streams}
    assert texts == {whole["choices"][0]["text"]} and len(whole["choices"][0]["text"]) > 0
    for _, chunks, _ in streams:  # one ordinary stream: one id, usage once, 12 tokens
        assert len({c["id"] for c in chunks}) == 1
        usage = [c["usage"] for c in chunks if c.get("usage")]
        assert len(usage) == 1 and usage[0]["completion_tokens"] == 12
    assert "kv_transfer_params" not in whole or whole["kv_transfer_params"] is None
    prompt_tokens = whole["usage"]["prompt_tokens"]
    assert loaded == 7 * (prompt_tokens - 1), "the decode replicas loaded every prompt's KV but its last token"
    assert outcomes == {"two_phase": 7}


def test_a_dead_prefill_replica_is_retried_on_another():
    async def go():
        async with Pools(prefill=1, dead_prefill=1) as p:
            texts = [(await _stream(p.client))[0] for _ in range(3)]
            return texts, p.accepted(Role.PREFILL), p.outcomes()

    texts, prefilled, outcomes = run(go())
    assert len(set(texts)) == 1 and prefilled == [3]
    assert outcomes["two_phase"] == 3 and outcomes["prefill_failed"] >= 1


def test_with_no_prefill_replica_answering_the_request_runs_aggregated():
    async def go():
        async with Pools(prefill=0, dead_prefill=2) as p:
            text, _, replica = await _stream(p.client)
            return text, replica, p.kv_loaded(), p.outcomes()

    text, replica, loaded, outcomes = run(go())
    assert text and replica.startswith("d") and loaded == 0
    assert outcomes == {"prefill_failed": 2, "aggregated_no_prefill": 1}


def test_a_dead_decode_replica_is_retried_with_the_same_handoff_then_the_request_runs_aggregated():
    async def go():
        async with Pools(decode=1, dead_decode=1) as p:
            first = [(await _stream(p.client))[2] for _ in range(2)]
            loaded = p.kv_loaded()
        async with Pools(decode=0, dead_decode=2) as p:
            text, _, replica = await _stream(p.client)
            return first, loaded, text, replica, p.outcomes()

    first, loaded, text, replica, outcomes = run(go())
    assert first == ["d1", "d1"] and loaded > 0, "the live decode replica took the hand-off"
    assert text and replica.startswith("p"), "no decode replica left: the whole request on a prefill replica"
    assert outcomes == {"two_phase": 1, "aggregated_decode_failed": 1}


def test_when_no_decode_replica_has_room_for_the_kv_the_request_runs_aggregated_without_a_prefill():
    async def go():
        async with Pools() as p:
            for r in p.table.replicas["m"].values():
                if r.endpoint.role == "decode":
                    r.kv_usage = 0.97
            text, _, _ = await _stream(p.client)
            return text, p.accepted(Role.PREFILL), p.outcomes()

    text, prefilled, outcomes = run(go())
    assert text and outcomes == {"aggregated_no_decode": 1}
    # The table's kv_usage was set by hand and no poll ran since: no prefill was spent on it.
    assert sum(prefilled) <= 1


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 5}),
    ("/v1/completions", {"model": "m", "prompt": PROMPT, "max_tokens": 5, "n": 1}),
])
def test_chat_and_completions_both_run_in_two_phases(path, body):
    async def go():
        async with Pools() as p:
            r = await p.client.post(path, json=body)
            return r.status_code, r.json(), p.outcomes()

    status, reply, outcomes = run(go())
    assert status == 200 and reply["usage"]["completion_tokens"] == 5 and outcomes == {"two_phase": 1}


def test_the_dashboard_shows_each_pool_as_its_own_row_and_the_cost_counts_each_pools_price():
    from hbmserve.capacity.perf.scenario import replica_usd_per_hour
    from hbmserve.deployments.ingress.dashboard_feed import DashboardFeed
    from hbmserve.deployments.ingress.door_metrics import Refusals, door_families
    from hbmserve.deployments.wire.engine_metrics import exposition
    from hbmserve.deployments.wire.names import pool_prices
    from tests.unit.deployments.ingress.test_metrics_door import samples

    async def go():
        async with Pools() as p:
            feed = DashboardFeed(SPEC, p.table, p.app.admission, lambda: ("node", 1, False))
            rows = {m.model: m for m in feed.inputs()}
            prices = pool_prices(SPEC.models, replica_usd_per_hour)
            cost = samples(exposition(door_families(Refusals(), {}, list(p.table.replicas["m"].values()), prices,
                                                    {})).decode())
            return rows, prices, cost

    rows, prices, cost = run(go())
    assert set(rows) == {"m (prefill)", "m (decode)"}
    assert [len(rows[k].replicas) for k in ("m (prefill)", "m (decode)")] == [2, 2]
    assert rows["m (prefill)"].fixed_replicas == rows["m (decode)"].fixed_replicas == 2
    assert set(prices) == {"m#prefill", "m#decode"}
    each = replica_usd_per_hour(SPEC.model("m").pool(Role.PREFILL))
    assert cost[("hbmserve_cost_usd_per_hour", (("model", "m"),))] == pytest.approx(4 * each)
