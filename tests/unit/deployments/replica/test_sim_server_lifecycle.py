"""The simulated engine's server, driven by hand as an ASGI server would: stream timing, client
disconnects, start-up, prefix caching, stop. Split from test_sim_server.py."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from hbmserve.capacity.perf.hardware import load_catalog
from hbmserve.capacity.perf.scenario import scenario_for
from hbmserve.capacity.perf.perf_model import cost_model
from hbmserve.deployments.replica.sim_protocol import estimate_tokens
from hbmserve.routing.replica_cap import AdmissionBudget
from hbmserve.deployments.replica.replica_http import EngineLoad
from hbmserve.deployments.replica.sim_server import SimHttpServer, build_sim_openai_app
from hbmserve.deployments.replica.vllm_server import engine_load
from hbmserve.routing.prefix import chat_prompt_text, prompt_block_hashes
from tests.unit.deployments.replica.test_sim_server import MML, NAME, chat_body, engine, run, spec


# ---- the app driven by hand, as an ASGI server would: timing and disconnects ----

async def drive(app, body: dict, disconnect_after_chunks: int | None = None) -> list[tuple[float, bytes]]:
    """POST /v1/chat/completions; returns (time, body bytes) per body message sent."""
    loop = asyncio.get_running_loop()
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "headers": [(b"content-type", b"application/json")], "http_version": "1.1",
             "scheme": "http", "server": ("sim", 80), "client": ("test", 1), "root_path": ""}
    gone = asyncio.Event()
    sent: list[tuple[float, bytes]] = []
    requested = False

    async def receive():
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.body" and message.get("body"):
            sent.append((loop.time(), message["body"]))
            if disconnect_after_chunks is not None and len(sent) >= disconnect_after_chunks:
                gone.set()

    await app(scope, receive, send)
    return sent


def test_stream_is_sent_as_tokens_are_produced_not_buffered():
    speedup, n = 4.0, 12
    eng = engine(speedup)
    sc = scenario_for(spec(speedup), load_catalog())

    async def go():
        try:
            return await drive(build_sim_openai_app(eng, NAME, MML), chat_body("hi", max_tokens=n, stream=True))
        finally:
            await eng.shutdown()

    sent = run(go())
    prompt = estimate_tokens("<|user|>\nhi\n<|assistant|>\n")
    cost = cost_model(sc.deployment)
    decode_s = sum(float(cost.step_time(1, prompt + 1 + j)) for j in range(n - 1)) / speedup
    first_token_at = sent[1][0]  # sent[0] is the role chunk
    assert b"[DONE]" in sent[-1][1]
    assert sent[-1][0] - first_token_at >= 0.5 * decode_s > 0


def test_client_disconnect_mid_stream_frees_the_engine_slot():
    eng = engine(speedup=1.0)

    async def go():
        app = build_sim_openai_app(eng, NAME, MML)
        sent = await drive(app, chat_body("long one", max_tokens=1000, stream=True), disconnect_after_chunks=4)
        for _ in range(200):
            s = eng.stats()
            if s.running == 0 and s.waiting == 0:
                break
            await asyncio.sleep(0.01)
        await eng.shutdown()
        return sent, s

    sent, stats = run(go())
    assert 4 <= len(sent) < 20
    assert b"[DONE]" not in b"".join(b for _, b in sent)
    assert (stats.running, stats.waiting, stats.num_finished) == (0, 0, 0)


# ---- the server: real uvicorn on loopback, middleware, lifecycle ----

FRONT_DOOR = {"x-hbmserve-internal": "token"}


def test_server_waits_out_startup_then_serves_only_the_front_door():
    speedup, startup_s = 50.0, 10.0

    async def go():
        server = SimHttpServer(spec(speedup, startup_s), "127.0.0.1", AdmissionBudget(8), "token")
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        url = await server.start()
        started_s = loop.time() - t0
        try:
            async with httpx.AsyncClient(base_url=url, timeout=10) as c:
                unauth = await c.get("/v1/models")
                health = await c.get("/health")
                r = await c.post("/v1/completions", headers=FRONT_DOOR,
                                 json={"model": NAME, "prompt": "hi", "max_tokens": 3})
            return started_s, unauth.status_code, health.status_code, r.json(), server.healthy(), server.counters
        finally:
            await server.stop()
            assert not server.healthy()

    started_s, unauth, health, body, healthy, counters = run(go())
    assert started_s >= startup_s / speedup
    assert (unauth, health, healthy) == (403, 200, True)
    assert body["usage"]["completion_tokens"] == 3
    assert (counters.accepted, counters.in_flight, len(counters.first_byte_s)) == (1, 0, 1)


def test_with_prefix_caching_a_shared_system_prompt_hits_the_cache_and_stats_report_it():
    system = {"role": "system", "content": "You answer questions about the billing system. " * 40}
    chats = [[system, {"role": "user", "content": f"Question {i}: " + "why is it so? " * 20}] for i in range(2)]
    model = spec().model_copy(update={"engine_settings": spec().engine_settings.model_copy(
        update={"enable_prefix_caching": True})})

    async def go():
        server = SimHttpServer(model, "127.0.0.1", AdmissionBudget(8), "token")
        url = await server.start()
        try:
            async with httpx.AsyncClient(base_url=url, timeout=10) as c:
                usage = []
                for messages in chats:  # one after the other: the first is cached when the second comes
                    r = await c.post("/v1/chat/completions", headers=FRONT_DOOR, json={"model": NAME, "messages": messages, "max_tokens": 2})
                    usage.append(r.json()["usage"]["prompt_tokens"])
            return usage, server.engine_stats()
        finally:
            await server.stop()

    usage, load = run(go())
    h0, h1 = (prompt_block_hashes(chat_prompt_text(m)) for m in chats)
    shared = next(i for i, (a, b) in enumerate(zip(h0, h1)) if a != b)
    assert shared > 20  # the system prompt is about 1,900 characters: ~30 blocks of 64
    # One hash is 64 characters = 16 estimated tokens; only the second request finds blocks cached.
    assert (load.prompt_tokens, load.prefix_hit_tokens) == (sum(usage), 16 * shared)


def test_vllm_load_sums_its_prometheus_samples():
    samples = [("vllm:num_requests_waiting", 2.0), ("vllm:num_requests_running", 3.0), ("vllm:kv_cache_usage_perc", 0.25),
               ("vllm:prefix_cache_queries_total", 900.0), ("vllm:prefix_cache_hits_total", 300.0),
               ("vllm:prefix_cache_queries_created", 1.7e9), ("vllm:num_requests_waiting", 1.0)]
    assert engine_load(samples) == EngineLoad(3, 3, 0.25, 900, 300)



def test_stop_lets_a_running_stream_finish_and_tpot_is_sampled():
    speedup = 1.0  # real-time pace: ~9 ms per token, well above timer noise

    async def stream(c: httpx.AsyncClient) -> tuple[int, bytes]:
        async with c.stream("POST", "/v1/completions", headers=FRONT_DOOR,
                            json={"model": NAME, "prompt": "hi", "max_tokens": 80, "stream": True}) as r:
            return r.status_code, b"".join([chunk async for chunk in r.aiter_bytes()])

    async def go():
        server = SimHttpServer(spec(speedup), "127.0.0.1", AdmissionBudget(8), "token")
        url = await server.start()
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            in_flight = asyncio.create_task(stream(c))
            await asyncio.sleep(0.2)
            stopping = asyncio.create_task(server.stop())  # removed while a stream is running
            await asyncio.sleep(0.3)  # uvicorn closes its listening socket on its next tick (0.1 s)
            with pytest.raises(httpx.ConnectError):
                async with httpx.AsyncClient(base_url=url, timeout=10) as fresh:
                    await fresh.get("/health")
            status, body = await in_flight
            await stopping
        return status, body, server.healthy(), server.counters

    status, body, healthy_after, counters = run(go())
    assert status == 200 and body.rstrip().endswith(b"data: [DONE]") and body.count(b'"text"') == 80
    assert not healthy_after
    # One streamed reply of 80 tokens gives one time-per-output-token sample: the simulated
    # decode pace (cost model step time for one sequence, sped up), within timer noise.
    (tpot,) = counters.tpot_samples(counters.finished[-1])
    cost = cost_model(scenario_for(spec(speedup), load_catalog()).deployment)
    prompt = estimate_tokens("hi")
    pace = sum(float(cost.step_time(1, prompt + 1 + j)) for j in range(79)) / speedup / 79
    assert 0.7 * pace <= tpot <= 2.0 * pace, (tpot, pace)


# ---- registration in the Serve app ----

def test_sim_engine_is_registered_without_cpu_or_gpu_reservation():
    from hbmserve.core.config import parse_cluster_spec
    from hbmserve.core.engine_settings import EngineKind
    from hbmserve.deployments.replica.engine_replica import ENGINE_SERVERS
    from hbmserve.deployments.wire.resources import actor_options
    from hbmserve.deployments.apps.model_app import unsupported_engines

    server = ENGINE_SERVERS[EngineKind.SIM](spec(), "127.0.0.1", "token")
    assert isinstance(server, SimHttpServer) and server.budget.max_in_flight == 8 * 4  # max_num_seqs x 4
    assert actor_options(spec()) == {"num_cpus": 0}
    ok = parse_cluster_spec({"models": [spec().model_dump()]})
    assert unsupported_engines(ok) == []
    bad = parse_cluster_spec({"models": [{**spec().model_dump(), "sim": {"gpu": "h900"}},
                                         {**spec().model_dump(), "name": "big",
                                          "sim": {"model_config_name": "llama-3.1-405b"}}]})
    problems = unsupported_engines(bad)
    assert len(problems) == 2
    assert problems[0].startswith(f"models.{NAME}.sim: unknown gpu 'h900'")
    assert problems[1].startswith("models.big:") and "h100-sxm" in problems[1]


def test_vllm_load_reads_only_its_five_families():
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    from hbmserve.deployments.replica.vllm_server import load_samples

    class Counted:
        """Another family of the registry; counts how often it is collected."""

        calls = 0

        def collect(self):
            Counted.calls += 1
            return iter(())

    reg = CollectorRegistry()
    for name, value in (("vllm:num_requests_waiting", 2), ("vllm:num_requests_running", 3), ("vllm:kv_cache_usage_perc", 0.25)):
        g = Gauge(name, "", ["engine"], registry=reg)
        g.labels("0").set(value)
        g.labels("1").set(value)
    Counter("vllm:prefix_cache_queries", "", ["engine"], registry=reg).labels("0").inc(900)
    hist = Histogram("vllm:time_to_first_token_seconds", "", ["engine"], registry=reg)
    reg.register(Counted())
    partial = CollectorRegistry()
    Gauge("vllm:num_requests_waiting", "", registry=partial).set(1)
    partial.register(Counted())
    # One family missing (prefix hits): the whole registry is read, as before.
    assert engine_load(load_samples(reg)) == EngineLoad(4, 6, 0.5, 900, 0) and Counted.calls == 1
    Counter("vllm:prefix_cache_hits", "", ["engine"], registry=reg).labels("0").inc(300)
    hist.labels("0").observe(0.1)
    assert engine_load(load_samples(reg)) == EngineLoad(4, 6, 0.5, 900, 300)
    assert Counted.calls == 1, "the other families are not collected"
    assert engine_load(load_samples(partial)) == EngineLoad(1, 0, 0.0, 0, 0) and Counted.calls == 2
