"""Scale to zero (min_replicas 0) live in Ray Serve, on simulated-engine replicas.

Two models on one head:
* `sleepy` starts with no engine replica. The front door lists it on `/v1/models`, holds the
  first requests (a streamed one and a plain one, through the `openai` SDK) while a replica
  starts (3 s simulated load), and forwards them; idle, it goes back to zero, still listed.
* `glacial` needs 60 s to load, and the front door holds its requests only 2 s: the client gets
  a 503 with Retry-After and an OpenAI-style error body instead of hanging.

Owns the local head for the module (see test_sim_serving.py on ordering): `down` before and after.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytestmark = pytest.mark.integration
SLEEPY, GLACIAL = "sleepy", "glacial"
PORT = 18250
LOAD_S = 3.0


def _model(name: str, load_s: float, wait_s: float) -> str:
    return f"""
  - name: {name}
    source: simulated
    engine: sim
    parallelism: {{tp: 1}}
    engine_settings: {{max_model_len: 4096, max_num_seqs: 8, max_num_batched_tokens: 2048}}
    sim: {{gpu: h100-sxm, model_config_name: llama-3.1-8b, speedup: 1, startup_s: {load_s}}}
    autoscaling:
      min_replicas: 0
      max_replicas: 2
      startup_s: {{hot: 1, warm: {load_s}, cold: {load_s + 5}}}
      upscale_delay_s: 1
      downscale_delay_s: 6
      downscale_cooldown_s: 4
      hot_standby: {{min: 0, max: 0}}
      scale_from_zero_wait_s: {wait_s}
"""


@pytest.fixture(scope="module")
def zero(head, tmp_path_factory):
    cfg = tmp_path_factory.mktemp("zero-config") / "cluster.yaml"
    cfg.write_text(f"name: hbmserve-zero-test\nserve: {{http: {{host: 127.0.0.1, port: {PORT}}}}}\nmodels:"
                   + _model(SLEEPY, LOAD_S, 60) + _model(GLACIAL, 60, 2))
    with head(cfg, PORT) as running:
        yield running["url"]


def _asleep(model: dict) -> bool:
    return model["replicas"].get("RUNNING", 0) == 0 and all(t["routable"] == 0 for t in model["traffic"])


def test_zero_replicas_still_list_the_model_then_the_first_requests_wake_it(zero, status, wait_for):
    import openai

    url = zero
    asleep = wait_for(_asleep, timeout_s=30, name=SLEEPY)
    assert _asleep(asleep), asleep
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=90)
    assert [m.id for m in client.models.list().data] == [SLEEPY, GLACIAL]

    def streamed() -> str:
        chunks = client.chat.completions.create(model=SLEEPY, messages=[{"role": "user", "content": "wake"}],
                                                max_tokens=16, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    def plain() -> tuple[int, str]:
        r = client.completions.create(model=SLEEPY, prompt="wake up", max_tokens=8)
        return r.usage.completion_tokens, r.choices[0].finish_reason

    t0 = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        s, p = pool.submit(streamed), pool.submit(plain)
        text, (tokens, finish) = s.result(timeout=120), p.result(timeout=120)
    held_s = time.monotonic() - t0
    assert len(text.split()) == 16 and (tokens, finish) == (8, "length")
    assert held_s >= LOAD_S  # they waited for the replica to load; nothing was refused

    assert sum(t["accepted"] for t in status(SLEEPY)["traffic"]) >= 2  # both held by the front door

    # Idle: back to zero, and the model is still listed.
    asleep = wait_for(_asleep, timeout_s=90, name=SLEEPY)
    assert _asleep(asleep), asleep
    assert asleep["autoscale"]["target_active"] == 0 and all(t["queued"] == 0 for t in asleep["traffic"])
    assert [m.id for m in client.models.list().data] == [SLEEPY, GLACIAL]


def test_no_replica_within_the_wait_is_a_503_with_retry_after(zero):
    glacial = zero
    t0 = time.monotonic()
    r = httpx.post(f"{glacial}/v1/chat/completions", timeout=30,
                   json={"model": GLACIAL, "messages": [{"role": "user", "content": "hello?"}], "max_tokens": 4})
    waited = time.monotonic() - t0
    assert r.status_code == 503, r.text
    assert int(r.headers["retry-after"]) >= 1
    err = r.json()["error"]
    assert err["code"] == "queue_timeout" and GLACIAL in err["message"]
    assert 2.0 <= waited < 20  # held for the configured 2 s, not until the 60 s load finished
    models = httpx.get(f"{glacial}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [SLEEPY, GLACIAL]
