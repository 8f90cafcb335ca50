"""LoRA adapters at the front door (issue 25), in process: simulated replicas on loopback behind
the door's app. An adapter is limited as its own model (its tenant access list, its own request
rate), routed to the replica that holds it, loaded on demand elsewhere, and metered per adapter
on /metrics: requests by status, tokens, TTFT, and the replicas' loads and unloads."""

from __future__ import annotations

import asyncio

from hbmserve.access.keys import KeyRing, parse_admin_token, parse_keys_file
from hbmserve.core.config import parse_cluster_spec
from tests.unit.deployments.ingress.test_front_door_app import KEY, SIM, Door, completion, run
from tests.unit.deployments.ingress.test_metrics_door import ADMIN, samples, wire

OTHER = "other-key-0123456789"


def cluster():
    return parse_cluster_spec({"serve": {"auth": {"keys_file": "/unused"}}, "models": [
        {"name": "m", "source": "sim", "engine": "sim", "replicas": 2, "sim": SIM,
         "engine_settings": {"max_model_len": 2048, "max_num_seqs": 4},
         "adapters": [{"name": "sql", "source": "/a/sql", "tenants": ["acme"]},
                      {"name": "chat", "source": "/a/chat", "requests_per_minute": 2}],
         "lora": {"max_loras": 1, "max_cpu_loras": 1}},
        {"name": "other", "source": "sim", "engine": "sim", "replicas": 1, "sim": SIM}]})


def keys() -> KeyRing:
    ring = parse_keys_file(f"tenants: [{{name: acme, keys: ['{KEY}']}}, {{name: beta, keys: ['{OTHER}']}}]", "k.yaml")
    return KeyRing(tenants=ring.tenants, keys=ring.keys, admin_digest=parse_admin_token(ADMIN, "admin"))


def with_meter(d: Door) -> dict:
    """wire's /metrics plus the adapter families, as FrontDoor._metrics adds them."""
    node = wire(d)["metrics_of"]

    async def metrics() -> bytes:
        from hbmserve.deployments.ingress.door_metrics import local_replicas
        from prometheus_client import generate_latest
        from prometheus_client.registry import CollectorRegistry

        class Own:
            def collect(self):
                return d.app.meter.families((r.endpoint.model, r.adapters) for r in local_replicas(d.table, "n"))

        reg = CollectorRegistry()
        reg.register(Own())
        return await node() + generate_latest(reg)

    return {"metrics_of": metrics}


def test_adapters_are_limited_routed_to_their_holder_and_metered():
    acme, beta = {"authorization": f"Bearer {KEY}"}, {"authorization": f"Bearer {OTHER}"}

    async def go():
        async with Door(cluster=cluster(), ring=keys(), wire=with_meter) as d:
            post = d.client.post
            first = await post("/v1/completions", json=completion("sql"), headers=acme)
            await asyncio.sleep(0.3)  # a poll: the door learns who holds sql
            second = await post("/v1/completions", json=completion("sql", stream=True), headers=acme)
            denied = await post("/v1/completions", json=completion("sql"), headers=beta)
            await asyncio.sleep(0.3)
            chats = [await post("/v1/completions", json=completion("chat"), headers=beta) for _ in range(3)]
            await asyncio.sleep(0.3)
            text = (await d.client.get("/metrics", headers={"authorization": f"Bearer {ADMIN}"})).text
            return first, second, denied, chats, samples(text)

    first, second, denied, chats, got = run(go())
    assert first.status_code == second.status_code == 200
    assert second.headers["x-hbmserve-replica"] == first.headers["x-hbmserve-replica"], "sql stays where it is"
    assert chats[0].headers["x-hbmserve-replica"] != first.headers["x-hbmserve-replica"], \
        "chat is loaded where a slot is free, not over sql"
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "model_not_allowed"
    assert "tenant beta may not use adapter sql" in denied.json()["error"]["message"]
    assert [r.status_code for r in chats] == [200, 200, 429], "chat's own 2 requests a minute"
    assert "adapter chat" in chats[2].json()["error"]["message"] and chats[2].headers["retry-after"]

    def value(name, **labels):
        return sum(v for (n, ls), v in got.items() if n == name and labels.items() <= dict(ls).items())

    assert value("hbmserve_adapter_requests_total", adapter="sql", code="200") == 2
    assert value("hbmserve_adapter_requests_total", adapter="chat", code="200") == 2
    assert value("hbmserve_adapter_tokens_total", adapter="sql", kind="completion") == 16  # 2 x max_tokens 8
    assert value("hbmserve_adapter_tokens_total", adapter="sql", kind="prompt") > 0
    assert value("hbmserve_adapter_ttft_seconds_count", adapter="sql") == 1, "the streamed one"
    assert value("hbmserve_adapter_loads_total", adapter="sql") == value("hbmserve_adapter_loads_total",
                                                                          adapter="chat") == 1
    assert value("hbmserve_adapter_resident_replicas", adapter="sql") == 1
    assert value("hbmserve_refusals_total", model="sql", reason="model_not_allowed", tenant="beta") == 1
    assert value("hbmserve_refusals_total", model="chat", reason="rate_limit_exceeded", tenant="beta") == 1


def test_an_access_list_without_auth_is_refused_naming_the_field():
    import pytest

    with pytest.raises(ValueError, match=r"models\.0\.adapters\.0\.tenants: an access list needs serve\.auth"):
        parse_cluster_spec({"models": [{"name": "m", "source": "sim", "engine": "sim",
                                        "adapters": [{"name": "a", "source": "/a", "tenants": ["t"]}]}]})


def test_the_dashboard_lists_each_adapter_with_its_traffic_and_loads():
    from hbmserve.deployments.ingress.dashboard_feed import DashboardFeed

    acme = {"authorization": f"Bearer {KEY}"}

    async def go():
        def wired(d):
            d.feed = DashboardFeed(d.spec, d.table, d.admission, lambda: ("node-1", 1, True))
            return {"dashboard": d.feed}

        async with Door(cluster=cluster(), ring=keys(), wire=wired) as d:
            await asyncio.gather(*(d.client.post("/v1/completions", headers=acme, json=completion(
                "sql", stream=True, stream_options={"include_usage": True})) for _ in range(3)))
            await asyncio.sleep(0.3)  # a poll: the replicas' loads reach the door
            return (await d.client.get("/hbm/dashboard/data", headers={"authorization": f"Bearer {ADMIN}"})).json()

    rows = {a["adapter"]: a for a in run(go())["adapters"]}
    assert set(rows) == {"sql", "chat"}
    sql = rows["sql"]
    assert (sql["model"], sql["requests"], sql["failed"], sql["completion_tokens"]) == ("m", 3, 0, 24)
    assert sql["ttft_p95_s"] > 0 and sql["loads"] >= 1 and sql["resident"] >= 1
    assert rows["chat"]["requests"] == rows["chat"]["loads"] == 0
