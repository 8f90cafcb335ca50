"""Black box: every token a tenant spends is charged, through `python -m hbmserve.ops.sim_door`
(the front door's app and server before simulated replicas, no Ray) with a keys file.

The hardening issue's cases, each on its own tenant allowed 2,000 tokens a minute: on main
before, `max_completion_tokens` beside `max_tokens`, numbers as strings, token-id prompts, long
messages and `n` as a string were each charged far less than the engine ran. Also: the engine's
usage settles what a request was charged (a chat without max_tokens is charged to the context's
end), a client that leaves the queue gives its place back at once, and a revoked key is refused
within 10 s without a restart.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.unit.deployments.ingress.sim_door_process import free_port, sim_door

LIMIT = 2000  # tokens per minute of each metered tenant
CASES = ["pair", "both-fields", "string", "token-ids", "long-message", "n-string", "prompt-list", "no-max"]
KEY = {name: f"sk-{name}-0123456789abcdef" for name in [*CASES, "roomy", "revoked", "kept"]}
HI = [{"role": "user", "content": "hi"}]
MAX_MODEL_LEN = 4096


def _keys_yaml(revoked: bool = False) -> str:
    lines = ["tenants:"]
    for name, key in KEY.items():
        if name == "revoked" and revoked:
            continue
        limit = 20_000 if name == "roomy" else None if name in ("revoked", "kept") else LIMIT
        lines.append(f"  - {{name: {name}, keys: ['{key}']" + (f", tokens_per_minute: {limit}}}" if limit else "}"))
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def door(tmp_path_factory):
    d = tmp_path_factory.mktemp("accounting")
    keys, cfg = d / "keys.yaml", d / "cluster.yaml"
    keys.write_text(_keys_yaml())
    port = free_port()
    sim = "{gpu: h100-sxm, model_config_name: llama-3.1-8b, speedup: 20}"
    slow = "{gpu: h100-sxm, model_config_name: llama-3.1-8b, speedup: 1}"  # ~10 ms a token: slots held for seconds
    cfg.write_text(f"""name: accounting
serve:
  http: {{host: 127.0.0.1, port: {port}, max_connections_per_client: 4096}}
  auth: {{keys_file: {keys}}}
models:
  - {{name: sim-a, source: simulated, engine: sim, replicas: 1, sim: {sim},
      engine_settings: {{max_model_len: {MAX_MODEL_LEN}, max_num_seqs: 8}}}}
  - {{name: sim-slow, source: simulated, engine: sim, replicas: 1, sim: {slow},
      engine_settings: {{max_model_len: {MAX_MODEL_LEN}, max_num_seqs: 2}}}}
""")
    with sim_door(cfg, port) as url:
        yield {"url": url, "keys": keys}


def _post(door, tenant: str, path: str, body: dict, timeout: float = 60) -> httpx.Response:
    return httpx.post(f"{door['url']}{path}", json={"model": "sim-a", **body}, timeout=timeout,
                      headers={"authorization": f"Bearer {KEY[tenant]}"})


CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
# (tenant, path, body, times sent, the statuses the door must answer)
ACCOUNTING = [
    ("pair", CHAT, {"messages": HI, "max_tokens": 1200}, 2, [200, 429]),
    # The engine runs max_completion_tokens: 1 token each, so all four fit (on main: 48,004 served).
    ("both-fields", CHAT, {"messages": HI, "max_tokens": 1200, "max_completion_tokens": 1}, 4, [200] * 4),
    ("string", CHAT, {"messages": HI, "max_tokens": "1200"}, 2, [200, 429]),
    ("token-ids", COMPLETIONS, {"prompt": list(range(3000)), "max_tokens": 1}, 2, [400, 400]),
    ("long-message", CHAT, {"messages": [{"role": "user", "content": "x" * 12_000}], "max_tokens": 1}, 1, [400]),
    # 4 x 600 (on main charged as one sequence, 601). The simulated engine runs n = 1 only, so
    # this case stops at the door.
    ("n-string", CHAT, {"messages": HI, "max_tokens": 600, "n": "4"}, 1, [400]),
    ("prompt-list", COMPLETIONS, {"prompt": ["a" * 4000, "b" * 4000], "max_tokens": 1}, 1, [400]),
    # No max_tokens: the reply may run to the end of the context (4,096 > 2,000): refused, saying why.
    ("no-max", CHAT, {"messages": HI}, 1, [400]),
]


@pytest.mark.parametrize(("tenant", "path", "body", "times", "statuses"), ACCOUNTING, ids=[c[0] for c in ACCOUNTING])
def test_each_tenant_is_charged_what_the_engine_runs(door, tenant, path, body, times, statuses):
    replies = [_post(door, tenant, path, body) for _ in range(times)]
    assert [r.status_code for r in replies] == statuses, [r.text[:200] for r in replies]
    served = sum(r.json()["usage"]["total_tokens"] for r in replies if r.status_code == 200)
    assert served <= LIMIT
    for r in replies:
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1 and r.json()["error"]["code"] == "rate_limit_exceeded"
        if r.status_code == 400:
            assert r.json()["error"]["code"] == "request_too_large"
    if tenant == "no-max":
        assert "max_tokens" in replies[0].json()["error"]["message"]


def test_the_engines_usage_settles_each_charge_streamed_or_not(door):
    # Without max_tokens each chat is charged to the context's end (~4,096 tokens): 20,000 a
    # minute pays for 4 at once. The simulated engine answers in 16 to 256 tokens and the
    # usage gives the rest back, so 16 in a row all go through.
    plain = [_post(door, "roomy", CHAT, {"messages": [{"role": "user", "content": f"q{i}"}]}) for i in range(8)]
    assert [r.status_code for r in plain] == [200] * 8
    assert sum(r.json()["usage"]["total_tokens"] for r in plain) < 20_000 / 4
    streamed = []
    for i in range(8):
        with httpx.stream("POST", f"{door['url']}{CHAT}", timeout=60, headers={"authorization": f"Bearer {KEY['roomy']}"},
                          json={"model": "sim-a", "messages": [{"role": "user", "content": f"s{i}"}], "stream": True}) as r:
            events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
        streamed.append((r.status_code, events))
    assert [status for status, _ in streamed] == [200] * 8
    for _, events in streamed:
        # The door asked the engine for the usage chunk and took it out again: the client, which
        # did not ask, gets the stream it would get from vLLM.
        assert events[-1] == "[DONE]" and all("usage" not in json.loads(e) for e in events[:-1])
        assert all(json.loads(e)["choices"] for e in events[:-1])
    # A client that asks for the usage chunk still gets it.
    with httpx.stream("POST", f"{door['url']}{CHAT}", timeout=60, headers={"authorization": f"Bearer {KEY['roomy']}"},
                      json={"model": "sim-a", "messages": HI, "stream": True, "max_tokens": 5,
                            "stream_options": {"include_usage": True}}) as r:
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert json.loads(events[-2])["usage"]["completion_tokens"] == 5


def test_a_client_that_leaves_the_queue_gives_its_place_back_at_once(door):
    url = door["url"]
    auth = {"authorization": f"Bearer {KEY['kept']}"}
    body = {"model": "sim-slow", "messages": HI, "max_tokens": 4000}

    def send(timeout: float) -> int | str:
        try:
            return httpx.post(f"{url}{CHAT}", json=body, headers=auth, timeout=timeout).status_code
        except httpx.TimeoutException:
            return "left"

    # sim-slow runs 2 sequences at once and queues 6 more (3 batches); the two running hold
    # their slots for longer than the test (they leave at 9 s, which cancels them).
    with ThreadPoolExecutor(8) as pool:
        running = [pool.submit(send, 9.0) for _ in range(2)]
        time.sleep(1.0)
        leavers = [pool.submit(send, 1.0) for _ in range(6)]  # queued, then gone after 1 s
        assert [f.result() for f in leavers] == ["left"] * 6
        time.sleep(0.3)
        # With the six places held until their requests expired, this got 429 queue_full at once.
        assert send(1.5) == "left"
        again = [pool.submit(send, 2.0) for _ in range(6)]  # the queue's six places, all free again
        time.sleep(0.5)
        assert send(1.0) == 429  # and now full
        assert [f.result() for f in again] == ["left"] * 6
        assert [f.result() for f in running] == ["left"] * 2


def test_a_revoked_key_is_refused_within_10_s_without_a_restart(door):
    assert _post(door, "revoked", COMPLETIONS, {"prompt": "hi", "max_tokens": 1}).status_code == 200
    door["keys"].write_text("tenants: [this is not a keys file")  # a bad edit: the old keys stay
    time.sleep(3)
    assert _post(door, "revoked", COMPLETIONS, {"prompt": "hi", "max_tokens": 1}).status_code == 200
    door["keys"].write_text(_keys_yaml(revoked=True))
    written = time.monotonic()
    while _post(door, "revoked", COMPLETIONS, {"prompt": "hi", "max_tokens": 1}).status_code != 401:
        assert time.monotonic() - written < 10, "the revoked key was still accepted after 10 s"
        time.sleep(0.25)
    assert _post(door, "kept", COMPLETIONS, {"prompt": "hi", "max_tokens": 1}).status_code == 200
