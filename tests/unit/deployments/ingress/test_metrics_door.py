"""The front door's /metrics, in process: real simulated-engine replicas on loopback behind the
front door's app (test_front_door_app.Door, no Ray). The admin token guards it; the engine
families come back renamed hbmserve_* with model and replica; refusals are counted by reason and
tenant; the price of the node's replicas is the catalog's."""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from hbmserve.access.keys import KeyRing, parse_admin_token, parse_keys_file
from hbmserve.deployments.ingress.door_metrics import door_families, local_replicas, node_metrics
from hbmserve.capacity.perf.scenario import replica_usd_per_hour
from hbmserve.deployments.wire.engine_metrics import ENGINE_FAMILIES
from tests.unit.deployments.ingress.test_front_door_app import KEY, TOKEN, Door, completion, run

ADMIN = "admin-token-0123456789abcdef"


def ring() -> KeyRing:
    tenants = parse_keys_file(f"tenants: [{{name: acme, keys: ['{KEY}'], requests_per_minute: 3}}]", "keys.yaml")
    return KeyRing(tenants=tenants.tenants, keys=tenants.keys, admin_digest=parse_admin_token(ADMIN, "admin"))


def wire(d: Door) -> dict:
    """What FrontDoor.__init__ does: the app's /metrics is the node's metrics (every test replica
    is on node "n")."""
    prices = {m.name: replica_usd_per_hour(m) for m in d.spec.models}

    async def metrics() -> bytes:
        local = local_replicas(d.table, "n")
        own = door_families(d.app.refusals, {n: a.queued for n, a in d.admission.items()}, local, prices,
                            {m.name: m.slo for m in d.spec.models})
        return await node_metrics(d.session, TOKEN, local, own, None)

    return {"metrics_of": metrics}


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_metrics_needs_the_admin_token_and_relabels_the_engines_of_the_node():
    async def go():
        async with Door(ring=ring(), wire=wire) as d:
            tenant = {"authorization": f"Bearer {KEY}"}
            served = [await d.client.post("/v1/completions", json=completion(max_tokens=6), headers=tenant)
                      for _ in range(4)]  # the 4th is over acme's 3 a minute
            await d.client.post("/v1/completions", json=completion(), headers={"authorization": "Bearer wrong"})
            bare = await d.client.get("/metrics")
            as_tenant = await d.client.get("/metrics", headers=tenant)
            admin = await d.client.get("/metrics", headers={"authorization": f"Bearer {ADMIN}"})
            return [r.status_code for r in served], bare, as_tenant, admin

    served, bare, as_tenant, admin = run(go())
    assert served == [200, 200, 200, 429]
    assert bare.status_code == 401 and bare.json()["error"]["code"] == "invalid_admin_token"
    assert as_tenant.status_code == 403
    assert admin.status_code == 200 and admin.headers["content-type"].startswith("text/plain")
    got = samples(admin.text)
    names = {name for name, _ in got}
    assert not any(n.startswith("vllm:") or n.endswith("_created") for n in names)

    def per_replica(sample: str) -> dict[str, float]:
        return {dict(labels)["replica"]: v for (n, labels), v in got.items() if n == sample}

    # Every family of both replicas, labelled model and replica, model_name gone.
    ttft_count = per_replica("hbmserve_time_to_first_token_seconds_count")
    assert set(ttft_count) == {"r0", "r1"} and sum(ttft_count.values()) == 3
    for (n, labels), _ in got.items():
        if n.startswith(tuple(ENGINE_FAMILIES.values())):
            assert {k for k, _ in labels} - {"le"} == {"model", "replica", "engine"}, n
    assert sum(per_replica("hbmserve_generation_tokens_total").values()) == 3 * 6
    assert sum(per_replica("hbmserve_e2e_request_latency_seconds_count").values()) == 3
    assert set(per_replica("hbmserve_requests_waiting")) == {"r0", "r1"}
    # Refusals: acme over its rate; an unknown key before any tenant or model was known.
    assert got[("hbmserve_refusals_total", (("model", "m"), ("reason", "rate_limit_exceeded"),
                                            ("tenant", "acme")))] == 1
    assert got[("hbmserve_refusals_total", (("model", "-"), ("reason", "invalid_api_key"), ("tenant", "-")))] == 1
    # Two simulated H100 replicas of m on this node at the catalog's price; none of `other`.
    h100 = replica_usd_per_hour(Door().spec.model("m"))
    assert h100 is not None and h100 > 0
    assert got[("hbmserve_cost_usd_per_hour", (("model", "m"),))] == 2 * h100
    assert got[("hbmserve_cost_usd_per_hour", (("model", "other"),))] == 0
    assert got[("hbmserve_door_queued_requests", (("model", "m"),))] == 0
    # Each model's SLO from the config, in seconds, for a dashboard to draw beside its p95.
    for model in Door().spec.models:
        assert got[("hbmserve_slo_seconds", (("kind", "ttft"), ("model", model.name)))] == model.slo.ttft_p95_ms / 1e3
        assert got[("hbmserve_slo_seconds", (("kind", "tpot"), ("model", model.name)))] == model.slo.tpot_p95_ms / 1e3


def test_a_replica_of_another_node_is_left_to_that_nodes_front_door():
    async def go():
        async with Door(replicas=2, poll=False, wire=wire) as d:
            other = d.table.get("m", "r1")
            other.endpoint = type(other.endpoint)(**{**other.endpoint.__dict__, "node_id": "elsewhere"})
            await d.client.post("/v1/completions", json=completion())
            return samples((await d.client.get("/metrics")).text)  # auth off: open, as every path

    got = run(go())
    replicas = {dict(labels).get("replica") for (n, labels), _ in got.items()
                if n == "hbmserve_time_to_first_token_seconds_count"}
    assert replicas == {"r0"}
    assert got[("hbmserve_cost_usd_per_hour", (("model", "m"),))] == replica_usd_per_hour(Door().spec.model("m"))


def test_the_price_of_a_replica_is_its_gpus_at_the_configured_or_catalog_price():
    spec = Door().spec
    m = spec.model("m")
    catalog_price = replica_usd_per_hour(m)
    tp4 = m.model_copy(update={"parallelism": m.parallelism.model_copy(update={"tp": 4})})
    assert math.isclose(replica_usd_per_hour(tp4), 4 * catalog_price)
    priced = m.model_copy(update={"hardware": m.hardware.model_copy(update={"usd_per_gpu_hour": 2.5})})
    assert replica_usd_per_hour(priced) == 2.5
    unknown = m.model_copy(update={"sim": m.sim.model_copy(update={"gpu": "no-such-gpu"})})
    assert replica_usd_per_hour(unknown) is None


def test_streams_moved_mid_stream_are_counted_by_model_and_outcome():
    from hbmserve.deployments.ingress.door_metrics import Refusals

    families = door_families(Refusals(), {}, [], {}, {}, {"resumed": {"m": 4}, "failed": {"m": 1}})
    text = b"".join(f"{s.name} {s.value} {sorted(s.labels.items())}\n".encode()
                    for f in families for s in f.samples).decode()
    assert "hbmserve_door_migrations_total 4 [('model', 'm'), ('outcome', 'resumed')]" in text
    assert "hbmserve_door_migrations_total 1 [('model', 'm'), ('outcome', 'failed')]" in text


def test_a_disaggregated_models_requests_are_counted_by_how_they_ran_and_its_replicas_by_pool():
    from hbmserve.deployments.ingress.door_metrics import Refusals
    from hbmserve.deployments.wire.engine_metrics import exposition, relabel
    from tests.unit.deployments.replica.test_metrics_engine import sim_metrics

    families = door_families(Refusals(), {}, [], {}, {}, None, None, {"m": {"two_phase": 5, "aggregated_no_decode": 1}})
    got = samples(exposition(families).decode())
    assert got[("hbmserve_disagg_requests_total", (("model", "m"), ("outcome", "two_phase")))] == 5
    assert got[("hbmserve_disagg_requests_total", (("model", "m"), ("outcome", "aggregated_no_decode")))] == 1
    engine = relabel(sim_metrics().families(), "m", "r1", "decode")
    assert all(s.labels["pool"] == "decode" for f in engine for s in f.samples)
    assert all("pool" not in s.labels for f in relabel(sim_metrics().families(), "m", "r1") for s in f.samples)


def test_the_kv_index_of_each_model_is_exported_with_what_was_lost_and_what_hashing_cost():
    from hbmserve.deployments.ingress.door_metrics import Refusals
    from hbmserve.deployments.kv.door_kv import KvDoorStats
    from hbmserve.deployments.wire.engine_metrics import exposition
    from hbmserve.routing.kv_index import IndexStats

    index = IndexStats(replicas=3, hbm_hashes=1200, host_hashes=5000, batches=90, stale_batches=2, gaps=3, resets=1,
                       overflowed=7, distrusted=("r2",), max_lag_s=0.25)
    kv = {"m": KvDoorStats(index, streams=2, unreadable=1, hashed=40, hash_s=0.02, tokenizer="loaded")}
    got = samples(exposition(door_families(Refusals(), {}, [], {}, {}, None, kv)).decode())

    def value(name: str, **labels: str) -> float:
        return got[(name, tuple(sorted({"model": "m", **labels}.items())))]

    assert value("hbmserve_kv_index_blocks", tier="hbm") == 1200 and value("hbmserve_kv_index_blocks", tier="host") == 5000
    assert value("hbmserve_kv_index_lag_seconds") == 0.25 and value("hbmserve_kv_index_streams") == 2
    assert value("hbmserve_kv_index_untrusted_replicas") == 1
    assert [value("hbmserve_kv_event_batches_total", outcome=o) for o in ("applied", "stale", "unreadable")] == [90, 2, 1]
    assert value("hbmserve_kv_index_gaps_total", outcome="replayed") == 2
    assert value("hbmserve_kv_index_gaps_total", outcome="reset") == 1
    assert value("hbmserve_kv_index_overflowed_blocks_total") == 7
    assert value("hbmserve_door_prompt_hash_seconds_total") / value("hbmserve_door_prompt_hashes_total") == 0.0005
    # A model without KV events exports none of these, not zeros that would read as "nothing cached".
    assert not any(k[0].startswith("hbmserve_kv_") for k in samples(exposition(
        door_families(Refusals(), {}, [], {}, {}, None, {})).decode()))
