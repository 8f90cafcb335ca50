"""The front door's request path, in process: real simulated-engine servers on loopback behind
the front door's ASGI app (no Ray). Routing, retry before the first byte, the error contract,
auth, tenant limits and admission."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import httpx
import pytest

from hbmserve.access.keys import parse_keys_file
from hbmserve.core.config import parse_cluster_spec
from hbmserve.core.records import ReplicaEndpoint
from hbmserve.deployments.ingress.front_door_access import AccessGuard
from hbmserve.deployments.ingress.front_door_app import FrontDoorApp
from hbmserve.deployments.ingress.request_body import BodyLimits
from hbmserve.deployments.ingress.front_door_queue import ModelAdmission
from hbmserve.deployments.ingress.replica_table import ReplicaTable
from hbmserve.deployments.replica.engine_replica import replica_budget
from hbmserve.deployments.replica.sim_server import SimHttpServer

TOKEN = "internal"
KEY = "tenant-key-0123456789"
SIM = {"gpu": "h100-sxm", "model_config_name": "llama-3.1-8b", "speedup": 200.0}


def spec(sim: dict = SIM, **serve):
    return parse_cluster_spec({"serve": serve, "models": [
        {"name": "m", "source": "sim", "engine": "sim", "replicas": 2, "sim": sim,
         "engine_settings": {"max_model_len": 2048, "max_num_seqs": 2}},
        {"name": "other", "source": "sim", "engine": "sim", "replicas": 1, "sim": SIM}]})


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


class Door:
    """Sim replicas of model `m` on loopback, the app in front, an httpx client on the app."""

    def __init__(self, replicas: int = 2, dead: int = 0, ring=None, limits: BodyLimits = BodyLimits(),
                 poll: bool = True, wire=None, cluster=None, front=None, lost_after_s: float = 5.0):
        self.spec = cluster or spec()
        self.front = front  # async (urls) -> the urls the door knows, e.g. behind a test proxy
        self.lost_after_s = lost_after_s
        self.n, self.dead, self.ring, self.limits, self.poll = replicas, dead, ring, limits, poll
        self.wire = wire  # (door) -> FrontDoorApp keyword arguments, as FrontDoor.__init__ injects them

    async def __aenter__(self):
        model = self.spec.model("m")
        self.servers = [SimHttpServer(model, "127.0.0.1", replica_budget(model), TOKEN) for _ in range(self.n)]
        urls = [await s.start() for s in self.servers]
        urls += [f"http://127.0.0.1:{_closed_port()}" for _ in range(self.dead)]
        if self.front is not None:
            urls = await self.front(urls)
        self.table = ReplicaTable(["m", "other"], set(), self.lost_after_s)
        eps = [ReplicaEndpoint(app="m", deployment="engine-m", replica=f"r{i}", model="m", url=u, node_id="n",
                               at=0.0) for i, u in enumerate(urls)]
        self.table.update(eps, {})
        self.session = aiohttp.ClientSession()
        self.admission = {m.name: ModelAdmission(m, self.table) for m in self.spec.models}
        self.app = FrontDoorApp(self.spec, self.table, AccessGuard(self.ring), self.admission, lambda: self.session,
                                TOKEN, self.limits, **(self.wire(self) if self.wire else {}))
        await self.table.poll(self.app.upstream, TOKEN)
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://door",
                                        timeout=30)
        # Tests that set replica state by hand run without the poll loop, which would overwrite it.
        self.poller = asyncio.get_running_loop().create_task(self._poll() if self.poll else asyncio.sleep(0))
        return self

    async def _poll(self):
        """The front door's poll loop: fresh loads, then release what now fits."""
        while True:
            await asyncio.sleep(0.05)
            await self.table.poll(self.app.upstream, TOKEN)
            for gate in self.admission.values():
                gate.pump()

    async def __aexit__(self, *exc):
        self.poller.cancel()
        await self.client.aclose()
        await self.session.close()
        for s in self.servers:
            await s.stop()


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def completion(model: str = "m", **kw) -> dict:
    return {"model": model, "prompt": "hello front door", "max_tokens": 8, **kw}


def test_requests_are_routed_to_live_replicas_and_name_them():
    async def go():
        async with Door() as d:
            replies = await asyncio.gather(*(d.client.post("/v1/completions", json=completion()) for _ in range(8)))
            served = [s.counters.accepted for s in d.servers]
            return [r.status_code for r in replies], {r.headers["x-hbmserve-replica"] for r in replies}, served

    codes, named, served = run(go())
    assert codes == [200] * 8
    assert named <= {"r0", "r1"} and sum(served) == 8
    assert all(n > 0 for n in served), served  # concurrent requests spread over both


def test_a_dead_replica_ranked_first_is_retried_on_a_live_one():
    async def go():
        async with Door(replicas=1, dead=1, poll=False) as d:
            dead = d.table.get("m", "r1")
            dead.reachable, dead.waiting = True, 0  # looks alive and idle: choose ranks it first
            d.table.get("m", "r0").waiting = 3
            r = await d.client.post("/v1/completions", json=completion())
            return r.status_code, r.headers.get("x-hbmserve-replica"), d.app.retried, dead.reachable

    status, replica, retried, dead_reachable = run(go())
    assert (status, replica) == (200, "r0")
    assert retried == {"m": 1} and dead_reachable is False


def test_no_live_replica_is_an_openai_503_not_a_plain_500():
    async def go():
        async with Door(replicas=0, dead=1, poll=False) as d:
            r1 = d.table.get("m", "r0")
            r1.reachable = True
            r = await d.client.post("/v1/completions", json=completion())
            return r.status_code, r.json()

    status, body = run(go())
    assert status == 502 and body["error"]["code"] == "replica_failed" and body["error"]["type"] == "server_error"


@pytest.mark.parametrize("request_kw, status, code", [
    ({"json": completion("no-such")}, 404, "model_not_found"),
    ({"json": {"prompt": "x"}}, 400, "missing_model"),
    ({"content": b"{not json"}, 400, "invalid_json"),
    ({"content": b"[1, 2]"}, 400, "invalid_json"),
    ({"content": b"x" * 5000}, 413, "request_too_large"),
])
def test_bad_requests_get_openai_errors(request_kw, status, code):
    async def go():
        async with Door(limits=BodyLimits(max_bytes=4096)) as d:
            return await d.client.post("/v1/completions", **request_kw)

    r = run(go())
    assert r.status_code == status and r.json()["error"]["code"] == code


def test_models_lists_every_model_and_one_model_by_name():
    async def go():
        async with Door() as d:
            return ((await d.client.get("/v1/models")).json(), (await d.client.get("/v1/models/other")).json(),
                    (await d.client.get("/v1/models/nope")).status_code)

    listed, one, missing = run(go())
    assert [m["id"] for m in listed["data"]] == ["m", "other"] and one["id"] == "other" and missing == 404


def test_auth_fails_closed_and_tenant_rate_limits_answer_429_with_retry_after():
    ring = parse_keys_file(f"tenants: [{{name: t, keys: ['{KEY}'], requests_per_minute: 2}}]", "keys.yaml")

    async def go():
        async with Door(ring=ring) as d:
            bare = await d.client.post("/v1/completions", json=completion())
            health = await d.client.get("/health")
            info = await d.client.get("/hbm/info", headers={"authorization": f"Bearer {KEY}"})
            ok = [await d.client.post("/v1/completions", json=completion(),
                                      headers={"authorization": f"Bearer {KEY}"}) for _ in range(3)]
            return bare, health, info, ok, d.admission["m"].refused_rps()

    bare, health, info, ok, refused_rps = run(go())
    assert bare.status_code == 401 and bare.json()["error"]["code"] == "invalid_api_key"
    assert health.status_code == 200
    assert info.status_code == 403  # a tenant key is not the admin token
    assert [r.status_code for r in ok] == [200, 200, 429]
    assert int(ok[2].headers["retry-after"]) >= 1 and ok[2].json()["error"]["type"] == "rate_limit_error"
    assert refused_rps == 0.0  # a tenant over its limit is not demand for more replicas


def test_a_burst_beyond_the_queue_is_refused_and_every_accepted_request_completes():
    # 2 replicas x max_num_seqs 2 = 4 running + 3 batches of queue = 12 sequences admitted.
    async def go():
        async with Door() as d:
            replies = await asyncio.gather(*(d.client.post("/v1/completions", json=completion(max_tokens=200))
                                             for _ in range(30)))
            return replies, d.admission["m"], d.admission["m"].refused_rps()

    replies, gate, refused_rps = run(go())
    codes = [r.status_code for r in replies]
    # Refused for capacity: reported to the autoscaler as demand (per second over a 30 s window).
    assert refused_rps == pytest.approx(codes.count(429) / 30)
    assert codes.count(200) >= 12 and codes.count(200) + codes.count(429) == 30, codes
    refused = [r for r in replies if r.status_code == 429]
    assert refused and all(int(r.headers["retry-after"]) >= 1 for r in refused)
    assert all(json.loads(r.text)["usage"]["completion_tokens"] == 200 for r in replies if r.status_code == 200)
    assert (gate.in_flight_sequences, gate.queued) == (0, 0)  # every slot given back


def test_the_live_front_door_routes_with_the_simulators_choose_unless_told_otherwise():
    from hbmserve.routing import routers as baselines
    from hbmserve.routing.choose import choose
    from hbmserve.capacity.sim import cluster_sim

    table = ReplicaTable(["m", "other"], set())
    app = FrontDoorApp(spec(), table, AccessGuard(None), {}, lambda: None, TOKEN, BodyLimits())
    assert app.route is choose and cluster_sim.choose is choose  # one function, both drivers
    rr = FrontDoorApp(spec(router="round-robin"), table, AccessGuard(None), {}, lambda: None, TOKEN, BodyLimits())
    assert rr.route is baselines.round_robin


def test_a_client_that_goes_away_cancels_its_upstream_request():
    from hbmserve.deployments.ingress.front_door_app import while_connected

    async def go():
        cancelled = asyncio.Event()

        async def relay_forever():
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        gone = asyncio.Event()

        async def receive():
            await gone.wait()
            return {"type": "http.disconnect"}

        waiter = asyncio.ensure_future(while_connected(receive, relay_forever()))
        await asyncio.sleep(0.05)
        gone.set()  # the client hangs up mid-stream
        left = await asyncio.wait_for(waiter, timeout=5)
        finished = await while_connected(receive, asyncio.sleep(0, result="done"))  # a finished relay is kept
        return cancelled.is_set(), left, finished

    cancelled, left, finished = run(go())
    assert cancelled and left is None and finished == "done"


def test_deploy_fails_closed_before_anything_starts_when_the_keys_cannot_be_loaded(tmp_path):
    from hbmserve.cluster import ray_cluster as rc

    missing = tmp_path / "no-such-keys.yaml"
    bad = tmp_path / "keys.yaml"
    bad.write_text(f"tenants: [{{name: t, keys: ['{KEY}', '{KEY}']}}]")  # a key listed twice
    for path, why in ((missing, "cannot read"), (bad, "tenants")):
        cfg = spec(auth={"keys_file": str(path)})
        with pytest.raises(rc.ClusterError) as err:
            rc.deploy(cfg)  # no Ray here: the keys are checked first
        message = str(err.value)
        assert "serve.auth" in message and why in message and KEY not in message, message


def test_an_adapter_is_listed_with_its_parent_and_served_by_name_on_its_base_models_replicas():
    cluster = parse_cluster_spec({"models": [
        {"name": "m", "source": "sim", "engine": "sim", "replicas": 2, "sim": SIM,
         "engine_settings": {"max_model_len": 2048, "max_num_seqs": 2},
         "adapters": [{"name": "m-sql", "source": "/adapters/sql"}, {"name": "m-chat", "source": "/adapters/chat"}]},
        {"name": "other", "source": "sim", "engine": "sim", "replicas": 1, "sim": SIM}]})

    async def go():
        async with Door(cluster=cluster) as d:
            listed = (await d.client.get("/v1/models")).json()
            one = (await d.client.get("/v1/models/m-sql")).json()
            reply = await d.client.post("/v1/completions", json=completion("m-sql"))
            chat = await d.client.post("/v1/chat/completions", json={
                "model": "m-chat", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
            missing = await d.client.post("/v1/completions", json=completion("m-nope"))
            return listed, one, reply, chat, missing, sum(s.counters.accepted for s in d.servers)

    listed, one, reply, chat, missing, served = run(go())
    assert [(c["id"], c["parent"]) for c in listed["data"]] == [("m", None), ("m-sql", "m"), ("m-chat", "m"),
                                                                ("other", None)]
    assert (one["id"], one["parent"]) == ("m-sql", "m")
    assert reply.status_code == 200 and reply.json()["model"] == "m-sql"  # the engine saw the adapter's name
    assert reply.headers["x-hbmserve-replica"] in {"r0", "r1"} and chat.status_code == 200
    assert chat.json()["model"] == "m-chat" and served == 2
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
