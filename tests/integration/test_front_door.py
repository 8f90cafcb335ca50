"""The front door on a real multi-node Ray cluster (ray.cluster_utils.Cluster: a head and two
worker raylets on this machine), real Serve, simulated engines, keys from files.

One deployment serves the whole module, in this order: one endpoint on every node; each node's
front door reaching replicas on the other nodes; the auth matrix; slow clients; overload; fuzzing;
one tenant's limit across the three doors; a key rotated without a restart; a worker node
removed under six streams, then a replica killed mid-stream and before its first byte: every
stream goes on from the other replica (mid-stream migration). Every test counts
what it sent, what was accepted and refused, and checks that nothing accepted was lost.
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from hbmserve.cluster import ray_cluster as rc
from hbmserve.deployments.replica.sim_protocol import filler_text
from tests.integration.front_door_cluster import (ADMIN, ADMIN_H, C_TOKENS_PER_MINUTE, KEY_A, KEY_B, KEY_C, KEY_D,
                                                  PORT, A, Started, actor_of, keys_text, cluster_spec,
                                                  node_of, stream_text)

ray = pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[cpu]')")

pytestmark = pytest.mark.integration

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from ray import serve
    from ray.cluster_utils import Cluster

    d = tmp_path_factory.mktemp("frontdoor-auth")
    keys, admin = d / "keys.yaml", d / "admin-token"
    keys.write_text(keys_text(KEY_C))
    admin.write_text(ADMIN + "\n")
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        workers = [c.add_node(num_cpus=1) for _ in range(2)]
        c.wait_for_nodes(timeout=60)
        rc.connect(c.address)
        spec = cluster_spec(keys, admin)
        endpoints = rc.deploy(spec)  # returns once every model has a replica the front door reaches
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (
                all({t.model: t.routable for t in d.models} == {"sim-a": 2, "sim-b": 1} for d in _doors())
                and [m.replicas for m in rc.status()] == [{"RUNNING": 2}, {"RUNNING": 1}]):
            time.sleep(0.5)  # the rest of the replicas, reachable and RUNNING for Serve
        yield {"cluster": c, "workers": workers, "spec": spec, "url": endpoints["sim-a"], "keys": keys}
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            c.shutdown()


def _doors():
    return rc.front_doors()


def _replicas(model: str) -> dict[str, dict]:
    (m,) = [m for m in rc.status() if m.name == model]
    return {r.replica: r for r in m.replica_stats}


def _complete(url: str, model: str = "sim-a", headers=A, max_tokens: int = 16, stream: bool = False,
              client: httpx.Client | None = None) -> httpx.Response:
    body = {"model": model, "prompt": "the front door", "max_tokens": max_tokens, "stream": stream}
    if client is not None:
        return client.post(f"{url}/v1/completions", json=body, headers=headers)
    return httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=60)


def test_one_endpoint_on_every_node_serves_every_model(cluster):
    doors = _doors()
    assert len(doors) == 3 and len({d.node_id for d in doors}) == 3  # one front door per node
    cluster["rss_before"] = {d.own_url: d.rss_mib for d in doors}
    assert {d.url for d in doors} == {cluster["url"]} == {f"http://127.0.0.1:{PORT}"}
    for door in doors:
        assert door.auth
        models = httpx.get(f"{door.own_url}/v1/models", headers=A, timeout=10).json()
        assert [m["id"] for m in models["data"]] == ["sim-a", "sim-b"]
        for model in ("sim-a", "sim-b"):
            r = _complete(door.own_url, model)
            assert r.status_code == 200, r.text
            assert r.json()["model"] == model
        missing = _complete(door.own_url, "no-such-model")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "model_not_found"
        assert {t.model: t.routable for t in door.models} == {"sim-a": 2, "sim-b": 1}


def test_each_front_door_reaches_replicas_on_other_nodes(cluster):
    by_replica = _replicas("sim-a")
    nodes = {r.replica.split(":")[0] for r in by_replica.values()}
    assert len(nodes) == 2, by_replica  # Serve spread the two replicas over two nodes
    for door in _doors():
        before = {k: r.accepted for k, r in _replicas("sim-a").items()}
        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda _: _complete(door.own_url, max_tokens=64).status_code, range(16)))
        assert codes == [200] * 16
        after = _replicas("sim-a")
        got = {k: r.accepted - before.get(k, 0) for k, r in after.items()}
        # Concurrent requests from one front door spread over both replicas, hence both nodes.
        assert all(n > 0 for n in got.values()) and sum(got.values()) == 16, got


PATHS = [("GET", "/health"), ("GET", "/v1/models"), ("GET", "/v1/models/sim-a"), ("POST", "/v1/completions"),
         ("POST", "/v1/chat/completions"), ("POST", "/tokenize"), ("POST", "/invocations"), ("GET", "/metrics"),
         ("GET", "/hbm/info"), ("GET", "/openapi.json"), ("GET", "/docs"), ("POST", "/v1/load_lora_adapter"),
         ("GET", "/version"), ("GET", "/v1/../hbm/info")]
CREDENTIALS = {"none": {}, "wrong": {"authorization": "Bearer not-a-key-at-all-000"}, "tenant": A,
               "admin": ADMIN_H}


def _expected(path: str, who: str) -> set[int]:
    if path == "/health":
        return {200}
    inference = path.startswith("/v1/") and ".." not in path and "lora" not in path or path in ("/tokenize", "/invocations")
    if inference:
        return {401} if who in ("none", "wrong", "admin") else {200, 400, 404}
    if who == "admin":
        return {200, 404}
    return {403} if who == "tenant" else {401}


def test_auth_matrix_every_path_and_credential(cluster):
    url, sent, refused = cluster["url"], 0, 0
    body = {"model": "sim-a", "prompt": "x", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    with httpx.Client(timeout=30) as client:
        for method, path in PATHS:
            for who, headers in CREDENTIALS.items():
                raw = client.build_request(method, url + "/", headers=headers, json=body if method == "POST" else None)
                raw.url = raw.url.copy_with(raw_path=path.encode())  # keep `..` as sent
                r = client.send(raw)
                sent += 1
                assert r.status_code in _expected(path, who), (method, path, who, r.status_code, r.text[:200])
                if r.status_code in (401, 403):
                    refused += 1
                    assert r.json()["error"]["type"] in ("authentication_error", "permission_error")
                    assert KEY_A not in r.text and ADMIN not in r.text
    assert refused >= 30
    info = httpx.get(f"{url}/hbm/info", headers=ADMIN_H, timeout=10).text
    assert KEY_A not in info and KEY_B not in info and ADMIN not in info


def test_slow_and_idle_clients_hold_no_admission_slot(cluster):
    url = cluster["url"]

    async def attack_and_serve():
        slow = []
        for _ in range(150):  # headers and one byte of a body, then silence (the attack)
            r, w = await asyncio.open_connection("127.0.0.1", PORT)
            w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY_A.encode()
                    + b"\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{")
            slow.append((r, w))
        for _ in range(40):  # idle connections that never send a byte
            slow.append(await asyncio.open_connection("127.0.0.1", PORT))
        ok = 0
        async with httpx.AsyncClient(timeout=30) as client:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 4:
                r = await client.post(f"{url}/v1/completions", headers=A,
                                      json={"model": "sim-a", "prompt": "real", "max_tokens": 8})
                assert r.status_code == 200, r.text
                ok += 1
        await asyncio.sleep(1.5)  # past body_timeout_s / header_timeout_s (2 s) for all of them
        answers = []
        for r, w in slow:
            answers.append(await asyncio.wait_for(r.read(), timeout=5))  # the server closed it
            w.close()
        return ok, answers

    ok, answers = asyncio.run(attack_and_serve())
    assert ok >= 10
    slow_bodies = [a for a in answers[:150]]
    assert all(b" 408 " in a.split(b"\r\n", 1)[0] for a in slow_bodies), slow_bodies[:2]
    print(f"slow-client attack: sent {ok} real requests, accepted {ok}, refused 0, lost 0; "
          f"190 slow/idle connections closed")


def test_overload_refuses_the_excess_and_loses_nothing_accepted(cluster):
    """A burst of 3x what sim-a admits at once (2 replicas x 4 running + 3 batches of queue each
    = 32 sequences, split between the three front doors), from one asyncio client."""
    url, sent = cluster["url"], 96

    async def one(client: httpx.AsyncClient, i: int):
        t0 = time.monotonic()
        body = {"model": "sim-a", "prompt": f"overload {i}", "max_tokens": 16, "stream": True}
        try:
            async with client.stream("POST", f"{url}/v1/completions", headers=A, json=body) as r:
                if r.status_code != 200:
                    await r.aread()
                    return r.status_code, r.headers.get("retry-after"), None, False
                first, done = None, False
                async for line in r.aiter_lines():
                    if first is None and line.startswith("data: "):
                        first = time.monotonic() - t0
                    done = done or line == "data: [DONE]"
                return 200, None, first, done
        except httpx.HTTPError as err:
            return "lost", repr(err), None, False

    async def burst():
        limits = httpx.Limits(max_connections=sent, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            return await asyncio.gather(*(one(client, i) for i in range(sent)))

    results = asyncio.run(burst())
    accepted = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] == 429]
    lost = [r for r in results if r[0] not in (200, 429) or (r[0] == 200 and not r[3])]
    slo_s = 2.0
    within = sum(1 for r in accepted if r[2] is not None and r[2] <= slo_s)
    print(f"overload: sent {sent}, accepted {len(accepted)}, refused {len(refused)}, lost {len(lost)}; "
          f"TTFT within the {slo_s:g} s SLO: {within}/{len(accepted)}")
    assert not lost, lost[:3]
    assert 8 <= len(accepted) <= 40 and len(refused) == sent - len(accepted), (len(accepted), len(refused))
    assert all(r[1] and int(r[1]) >= 1 for r in refused)  # Retry-After on every 429
    assert within >= 0.95 * len(accepted), sorted(r[2] for r in accepted)[-5:]


def test_fuzzing_the_openapi_surface_finds_no_server_error(cluster):
    """Schemathesis, against the document the front door serves, valid and invalid requests
    alike, bounded: no 5xx. Runs before the fault tests below (they break replicas on purpose)."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable

    url = cluster["url"]
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=ADMIN_H)
    sent, errors, statuses = 0, [], {}
    for result in schema.get_all_operations():
        op = result.ok()
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            @settings(max_examples=25, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode))
            def call(case):
                nonlocal sent
                r = case.call(base_url=url, headers=A, timeout=30)
                sent += 1
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                if r.status_code >= 500:
                    errors.append(f"{case.method} {case.formatted_path} -> {r.status_code}: {r.text[:200]}")

            try:
                call()
            except Unsatisfiable:
                pass  # nothing to make invalid (e.g. GET /health has no parameters)
    print(f"schemathesis: sent {sent}, statuses {dict(sorted(statuses.items()))}, 5xx {len(errors)}")
    assert sent >= 100 and not errors, errors[:5]


def test_three_doors_together_admit_one_tenants_limit(cluster):
    """20 requests of ~103 tokens to each of the three front doors at once, 6,200 tokens in all,
    from a tenant allowed 3,000 a minute. On main each door kept a whole limit: all 60 went
    through. Now each holds a third of it."""
    doors = _doors()
    assert len(doors) == 3
    auth = {"authorization": f"Bearer {KEY_C}"}
    body = {"model": "sim-a", "prompt": "the front door", "max_tokens": 100}

    async def burst():
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=64)) as client:
            sends = [client.post(f"{d.own_url}/v1/completions", headers=auth, json=body) for d in doors for _ in range(20)]
            return await asyncio.gather(*sends)

    t0 = time.monotonic()
    replies = asyncio.run(burst())
    elapsed = time.monotonic() - t0
    per_door = [[r.status_code for r in replies[i * 20:(i + 1) * 20]] for i in range(3)]
    served = sum(r.json()["usage"]["total_tokens"] for r in replies if r.status_code == 200)
    print(f"three doors, one tenant of {C_TOKENS_PER_MINUTE} tokens/min: accepted per door "
          f"{[codes.count(200) for codes in per_door]}, refused {sum(c.count(429) for c in per_door)}, "
          f"tokens served {served} in {elapsed:.1f} s")
    assert all(set(codes) <= {200, 429} for codes in per_door), per_door
    assert served <= C_TOKENS_PER_MINUTE * (1 + elapsed / 60)
    assert all(codes.count(200) >= 7 for codes in per_door)  # each door its third: ~9 of ~103 tokens
    refused = [r for r in replies if r.status_code == 429]
    assert refused and all(int(r.headers["retry-after"]) >= 1 for r in refused)
    # One request bigger than a door's third can never be admitted, and is told why.
    big = httpx.post(f"{doors[0].own_url}/v1/completions", headers=auth, timeout=30,
                     json={**body, "max_tokens": 1500})
    assert big.status_code == 400 and "3 front doors" in big.json()["error"]["message"]


def test_a_rotated_key_takes_effect_on_every_door_within_10_s(cluster):
    """The keys file rewritten (as a Kubernetes Secret update does): team-c's old key revoked and
    a new one issued, no restart."""
    cluster["keys"].write_text(keys_text(KEY_D))
    written, old, new = time.monotonic(), {"authorization": f"Bearer {KEY_C}"}, {"authorization": f"Bearer {KEY_D}"}
    pending = {d.own_url for d in _doors()}
    while pending:
        for url in sorted(pending):
            if (httpx.get(f"{url}/v1/models", headers=old, timeout=10).status_code == 401
                    and httpx.get(f"{url}/v1/models", headers=new, timeout=10).status_code == 200):
                pending.discard(url)
        assert time.monotonic() - written < 10, f"doors still on the old keys after 10 s: {pending}"
        time.sleep(0.25)
    print(f"key rotation: every door refused the old key {time.monotonic() - written:.1f} s after the write")


def test_front_door_memory_stays_bounded_through_attack_overload_and_fuzzing(cluster):
    grown = {d.own_url: d.rss_mib - cluster["rss_before"][d.own_url] for d in _doors()}
    print(f"front door RSS growth (MiB) after the attack, overload and fuzzing: {grown}")
    assert all(g < 64 for g in grown.values()), grown


def _routable(door_url: str, model: str) -> int:
    info = httpx.get(f"{door_url}/hbm/info", headers=ADMIN_H, timeout=10).json()
    return next(t["routable"] for t in info["models"] if t["model"] == model)


def _migrated(node_id: str | None = None) -> int:
    """Streams of sim-a moved mid-way by the doors (on one node's door, given its id)."""
    return sum(t.migrated for d in _doors() if node_id in (None, d.node_id) for t in d.models if t.model == "sim-a")


def test_worker_node_removed_streams_go_on_and_the_service_answers_at_once(cluster):
    c = cluster["cluster"]
    head_door = next(d for d in _doors() if d.node_id == c.head_node.node_id)
    assert _routable(head_door.own_url, "sim-a") == 2
    on_workers = {w.node_id: w for w in cluster["workers"]}
    victim = next((on_workers[n["NodeID"]] for n in ray.nodes() if n["Alive"] and n["NodeID"] in on_workers
                   and any(r.replica.startswith(n["NodeID"][:8]) for r in _replicas("sim-a").values())), None)
    assert victim is not None, "no sim-a replica on a worker node"
    # Three long streams over both replicas, the node removed under them as soon as one runs there
    # (waiting for all to start could find the node's streams ended: CI once saw none move). Three
    # leave the replica that stays a free sequence (it runs 4) for the requests sent after.
    migrated_before, started = _migrated(head_door.node_id), [Started() for _ in range(3)]
    with ThreadPoolExecutor(3) as pool:
        streams = [pool.submit(stream_text, head_door.own_url, 1800, e) for e in started]
        on_victim: set[str] = set()  # the replicas on the node to be removed that streams started on
        deadline = time.monotonic() + 30
        while not on_victim and time.monotonic() < deadline:
            on_victim = {e.replica for e in started if e.is_set() and node_of(e.replica) == victim.node_id}
            time.sleep(0.05)
        assert on_victim, f"no stream started on the node to be removed in 30 s: {[e.replica for e in started]}"
        c.remove_node(victim)
        t0, codes, first_error = time.monotonic(), [], None
        with httpx.Client(timeout=30) as client:
            while time.monotonic() - t0 < 5:
                r = _complete(head_door.own_url, client=client)
                codes.append(r.status_code)
                first_error = first_error or (r.text if r.status_code != 200 else None)
        replies = [f.result(timeout=120) for f in streams]
    moved = _migrated(head_door.node_id) - migrated_before
    ran_there = sum(e.replica in on_victim for e in started)
    print(f"node removed: sent {len(codes)} in the next 5 s, accepted {codes.count(200)}, "
          f"lost {len(codes) - codes.count(200)}; 3 streams, {ran_there} on the node removed, "
          f"{moved} moved to the other replica, "
          f"{sum(done for _, done, _ in replies)} complete")
    assert codes and codes == [200] * len(codes), first_error
    assert all(text == filler_text(1800) and done for text, done, _ in replies)  # no token lost or repeated
    assert moved == ran_there


def test_replica_killed_mid_stream_the_stream_goes_on_from_the_other(cluster):
    url = cluster["url"]
    # Serve replaces the replica lost with the node above. The public port is shared by every
    # node's front door and each discovers the new replica on its own: wait until all of them
    # route to both (asking the shared port once could reach a door that has not yet).
    def everywhere() -> list[int]:
        return [_routable(d.own_url, "sim-a") for d in _doors()]

    deadline = time.monotonic() + 90
    while min(everywhere()) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert min(everywhere()) == 2, everywhere()
    migrated_before, started = _migrated(), Started()
    with ThreadPoolExecutor(1) as pool:
        stream = pool.submit(stream_text, url, 1500, started)
        assert started.wait(30)
        ray.kill(actor_of(started.replica), no_restart=False)  # the replica process dies mid-stream
        text, done, _ = stream.result(timeout=120)
    assert text == filler_text(1500) and done
    assert _migrated() - migrated_before == 1
    # Right after: requests arriving while the dead replica may still look alive are retried
    # on the other one before any byte is sent; none fails.
    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: _complete(url).status_code, range(24)))
    print(f"replica killed: the stream went on whole; sent 24 after the kill, accepted {codes.count(200)}, "
          f"lost {24 - codes.count(200)}; retried {sum(t.retried for d in _doors() for t in d.models if t.model == 'sim-a')}")
    assert codes == [200] * 24
