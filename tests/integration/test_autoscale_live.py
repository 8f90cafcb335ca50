"""The hbmserve autoscaling policy live in Ray Serve, on simulated-engine replicas.

One hot standby is kept (engine loaded, not routed to by the front door). A burst builds a queue; the policy
promotes the standby first (the fastest tier) and starts more replicas; every request
completes. Then a trickle of long streamed requests runs while idle capacity is scaled back
down, and none of them is dropped: replicas being removed or demoted drain (stop accepting,
finish in-flight). The decisions and their reasons are read back through `hbmserve status --json`.

Owns the local head for the module (see test_sim_serving.py on ordering): `down` before and after.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytestmark = pytest.mark.integration
MODEL = "llama-70b-autoscaled"
PORT = 18200
MAX_REPLICAS = 3
MAX_TOKENS = 120
LOAD_S = 2.0  # simulated engine load: the warm start-up the replicas measure


@pytest.fixture(scope="module")
def autoscaled(head, tmp_path_factory):
    cfg = tmp_path_factory.mktemp("autoscale-config") / "cluster.yaml"
    cfg.write_text(
        f"""name: hbmserve-autoscale-test
serve: {{http: {{host: 127.0.0.1, port: {PORT}}}}}
models:
  - name: {MODEL}
    source: simulated
    engine: sim
    parallelism: {{tp: 4}}
    engine_settings: {{max_model_len: 4096, max_num_seqs: 4, max_num_batched_tokens: 1024}}
    sim: {{gpu: h100-sxm, model_config_name: llama-3.1-70b, speedup: 1, startup_s: {LOAD_S}}}
    # Loose: this test is about scaling; the front door's SLO refusals are test_front_door's.
    slo: {{ttft_p95_ms: 10000, tpot_p95_ms: 100}}
    autoscaling:
      min_replicas: 1
      max_replicas: {MAX_REPLICAS}
      target_queue_per_replica: 2
      replica_capacity_rps: 1.0
      startup_s: {{hot: 1, warm: 4, cold: 8}}
      upscale_delay_s: 1
      downscale_delay_s: 8
      downscale_cooldown_s: 5
      hot_standby: {{min: 1, max: 1}}
      # The burst envelope off: held through the lull, the burst's replicas would stay for its
      # 30-min memory when the misses they save outweigh their idle cost, a margin the machine's
      # speed moves (it held 2 in one CI run). The envelope's own live test is
      # test_autoscale_live_parity.py; here the reactive path must come back down.
      burst: {{memory_s: 0}}
"""
    )
    with head(cfg, PORT) as running:
        yield running["url"]


def _stream_one(url: str) -> int:
    """One streamed completion; a 429 is retried after its Retry-After, as an OpenAI client
    does. Returns the completion tokens the final usage chunk reports."""
    body = {"model": MODEL, "prompt": "scale me", "max_tokens": MAX_TOKENS, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.Client(timeout=120) as client:
        for _ in range(30):
            with client.stream("POST", f"{url}/v1/completions", json=body) as r:
                if r.status_code != 429:
                    return _read_stream(r)
                r.read()
                time.sleep(int(r.headers["retry-after"]))
    raise AssertionError("refused 30 times")


def _read_stream(r) -> int:
    assert r.status_code == 200, r.read()
    usage, done = None, False
    for line in r.iter_lines():
        if line == "data: [DONE]":
            done = True
        elif line.startswith("data: "):
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
    assert done, "stream ended without [DONE]"
    return usage["completion_tokens"]


def _flood(url: str, n: int) -> list[int]:
    """`n` concurrent requests, no retries: the status codes."""
    body = {"model": MODEL, "prompt": "flood", "max_tokens": MAX_TOKENS}
    with httpx.Client(timeout=120) as client, ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: client.post(f"{url}/v1/completions", json=body).status_code, range(n)))


def _roles(model: dict) -> list[str]:
    return sorted(r["role"] for r in model["replica_stats"])


def _settled(model: dict) -> bool:
    """One active replica serving and one hot standby loaded, as configured at rest."""
    return model["replicas"] == {"RUNNING": 2} and _roles(model) == ["active", "standby"]


def test_burst_scales_up_then_idle_scales_down_without_dropping(autoscaled, status, wait_for):
    url = autoscaled
    start = wait_for(_settled, timeout_s=60)
    assert _settled(start), start
    (standby,) = [r["replica"] for r in start["replica_stats"] if r["role"] == "standby"]
    assert start["autoscale"]["standby_replicas"] and start["autoscale"]["target_standby"]["hot"] == 1
    # The policy plans with the start-up the replicas measured, not the configured 4 s.
    assert LOAD_S <= start["autoscale"]["startup_s"]["warm"] < LOAD_S + 1.5, start["autoscale"]["startup_s"]

    # Burst: 12 clients x 6 sequential requests against max_num_seqs=4 builds a queue of ~8, and
    # lasts long enough (~50 s on one replica) for added replicas to take part.
    with ThreadPoolExecutor(12) as pool:
        burst = [pool.submit(_stream_one, url) for _ in range(72)]
        scaled = wait_for(lambda m: _roles(m).count("active") >= 2, timeout_s=120)
        results = [f.result(timeout=300) for f in burst]
    assert results == [MAX_TOKENS] * 72  # every accepted request finished, in full
    assert _roles(scaled).count("active") >= 2, scaled
    decision = scaled["autoscale"]
    assert decision is not None and decision["serve_target"] >= 2
    assert decision["reason"]  # the human-readable why
    after = status()
    served_by = {r["replica"]: r["accepted"] for r in after["replica_stats"] if r["accepted"] > 0}
    assert len(served_by) >= 2, after["replica_stats"]  # the added capacity really served
    # The hot standby was the first tier used: it was promoted and served part of the burst.
    assert served_by.get(standby, 0) > 0, (standby, after["replica_stats"])

    # Idle, apart from one long streamed request at a time: capacity must come back down, and
    # every request that was in flight on a removed replica must still finish.
    stop = threading.Event()
    trickle: list[int] = []
    errors: list[BaseException] = []

    def trickle_loop() -> None:
        while not stop.is_set():
            try:
                trickle.append(_stream_one(url))
            except BaseException as err:  # noqa: BLE001 - reported by the assertion below
                errors.append(err)
                return

    t = threading.Thread(target=trickle_loop)
    t.start()
    try:
        down = wait_for(_settled, timeout_s=150)
    finally:
        stop.set()
        t.join(timeout=150)
    assert _settled(down), (down["replicas"], down["replica_stats"], down["autoscale"])
    assert down["autoscale"]["target_active"] == 1 and down["autoscale"]["serve_target"] == 2
    assert not errors, errors
    assert trickle and all(n == MAX_TOKENS for n in trickle)


def test_decisions_reach_a_real_prometheus(autoscaled, cli, wait_for, tmp_path):
    """Requirement 3's "exported as metrics": the decision gauges, scraped by a real Prometheus
    from the targets `hbmserve status --json` lists, as the ops dashboard would read them."""
    from tests.integration.prometheus_server import prometheus_server

    settled = wait_for(_settled, timeout_s=150)
    assert _settled(settled), (settled["replica_stats"], settled["autoscale"])
    r = cli("status", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    targets = json.loads(r.stdout.strip().splitlines()[-1])["metrics_targets"]
    assert targets
    # Every node of the local head is this machine; Ray reports it by its interface address,
    # and tests send traffic to loopback only, so scrape the same ports there.
    targets = [f"127.0.0.1:{t.rsplit(':', 1)[1]}" for t in targets]
    app = f'{{application="{MODEL}"}}'
    with prometheus_server(targets, tmp_path) as prom:
        active = prom.wait_for(f"ray_hbmserve_autoscale_active_replicas{app}", lambda v: v == 1, 90)
        standby = prom.wait_for(f"ray_hbmserve_autoscale_standby_replicas{app}", lambda v: v == 1, 30)
        target = prom.wait_for(f"ray_hbmserve_autoscale_target_replicas{app}", lambda v: v == 2, 30)
        held = prom.query(f"ray_hbmserve_autoscale_held_requests{app}")
        # A flood beyond the front door's queue: the refusals reach the policy as demand.
        codes = _flood(url=autoscaled, n=40)
        refused = prom.wait_for(f"ray_hbmserve_autoscale_refused_rps{app}", lambda v: v > 0, 60)
    assert codes.count(429) > 0 and set(codes) <= {200, 429}, codes
    assert refused and refused[0][1] > 0, refused
    assert [v for _, v in active] == [1.0], active
    assert [v for _, v in standby] == [1.0], standby
    assert [v for _, v in target] == [2.0], target  # Serve runs the active one plus the standby
    assert [v for _, v in held] == [0.0] and held[0][0]["deployment"] == "engine-" + MODEL, held
