"""Black box: `python -m hbmserve.ops.sim_door` (the front door's app and server in front of
simulated replicas, no Ray) attacked as in the hardening issue. One address opens far more
silent sockets than it may hold and refreshes them; the door stays ready and serves real
requests from another address. On the listener before, 63 silent sockets made `/health` 503."""

from __future__ import annotations

import socket

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.deployments.ingress.content_parts import PARTS, well_formed
from tests.unit.deployments.ingress.sim_door_process import free_port, sim_door

ATTACKER = "127.0.0.2"
PER_CLIENT = 64  # the shipped default of serve.http.max_connections_per_client


@pytest.fixture(scope="module")
def door(tmp_path_factory):
    cfg = tmp_path_factory.mktemp("door") / "cluster.yaml"
    port = free_port()
    # The shipped caps, and deadlines longer than the test so that only the caps decide.
    cfg.write_text(f"""name: socket-attack
serve: {{http: {{host: 127.0.0.1, port: {port}, max_in_flight: 16, idle_connection_s: 60, header_timeout_s: 60}}}}
models:
  - name: sim-a
    source: simulated
    engine: sim
    replicas: 1
    sim: {{gpu: h100-sxm, model_config_name: llama-3.1-8b, speedup: 20}}
    engine_settings: {{max_model_len: 2048, max_num_seqs: 8}}
""")
    with sim_door(cfg, port) as url:
        yield url


def _silent(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(ATTACKER, 0))
    return s


def test_silent_sockets_from_one_address_leave_the_door_ready_and_serving(door):
    port = int(door.rsplit(":", 1)[1])
    held = [_silent(port) for _ in range(PER_CLIENT + 36)]  # 100 sockets, 8 more each probe below
    probes, answers = [], []
    with httpx.Client(base_url=door, timeout=10) as client:
        for i in range(15):
            held += [_silent(port) for _ in range(8)]
            probes.append(client.get("/health").status_code)
            r = client.post("/v1/completions", json={"model": "sim-a", "prompt": f"p{i}", "max_tokens": 4})
            answers.append(r.status_code)
    # The sockets past the address's cap were answered 429 and closed by the door.
    refused = 0
    for s in held:
        s.settimeout(0.05)
        try:
            refused += s.recv(64).startswith(b"HTTP/1.1 429")
        except TimeoutError:
            pass  # held open: silent, within the cap
        s.close()
    assert probes == [200] * 15 and answers == [200] * 15
    assert refused == len(held) - PER_CLIENT


def test_a_probe_from_the_attackers_address_is_answered_while_its_sockets_stay_capped(door):
    """A kubelet probes from a node that also carries traffic: 200 idle sockets from that
    address fill its cap, and its /health and /metrics still reach the door, as from another
    address; a completion from the full address is refused, one from elsewhere served."""
    port = int(door.rsplit(":", 1)[1])
    held = [_silent(port) for _ in range(200)]
    try:
        same = httpx.Client(base_url=door, timeout=10, transport=httpx.HTTPTransport(local_address=ATTACKER))
        other = httpx.Client(base_url=door, timeout=10)
        with same, other:
            probes = [[c.get(p).status_code for p in ("/health", "/metrics") for _ in range(5)] for c in (same, other)]
            ask = {"model": "sim-a", "prompt": "p", "max_tokens": 4}
            work = [c.post("/v1/completions", json=ask).status_code for c in (same, other)]
    finally:
        for s in held:
            s.close()
    # The sim door has no /metrics page (404), but the listener lets the scrape through to the
    # app from the full address as from any other (the real door's /metrics: test_connection_caps.py).
    assert probes == [[200] * 5 + [404] * 5] * 2
    assert work == [429, 200]


@pytest.mark.parametrize(("body", "param", "code"), [
    (b"[" * 400_000 + b"]" * 400_000, None, "invalid_json"),  # a RecursionError was a 500
    (b'{"model": "sim-a", "messages": [1, 2, 3]}', "messages.0", "invalid_request_body"),
    (b'{"model": "sim-a", "messages": [{"role": "user", "content": "hi"}], "n": 4.5}', "n", "invalid_request_body"),
    (b'{"model": "sim-a", "messages": [{"role": "user", "content": "hi"}], "n": 9}', "n", "too_many_sequences"),
    (b'{"model": "sim-a", "prompt": ["a", "b", "c"], "n": 3}', "n", "too_many_sequences"),  # 9 > max_num_seqs 8
])
def test_a_malformed_body_is_an_openai_400_naming_the_field(door, body, param, code):
    path = "/v1/completions" if b'"prompt"' in body else "/v1/chat/completions"
    r = httpx.post(f"{door}{path}", content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == code and error["param"] == param


def test_numbers_as_strings_are_read_as_the_engine_reads_them(door):
    r = httpx.post(f"{door}/v1/chat/completions", timeout=30, json={
        "model": "sim-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "12000",
        "max_completion_tokens": "3", "n": "1"})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3  # max_completion_tokens wins, as in vLLM


def test_a_text_part_whose_text_is_a_number_is_an_openai_400(door):
    r = httpx.post(f"{door}/v1/chat/completions", timeout=30, json={
        "model": "sim-a", "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]})
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json"), r.text
    error = r.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error", "invalid_request_body", "messages.0.content.0.text")


@given(parts=st.lists(PARTS, min_size=1, max_size=3))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_every_content_part_gets_an_answer_and_every_error_is_json(door, parts):
    """Through the door's HTTP surface: well-formed parts are served, every other is an OpenAI
    400 naming the bad part; never a 5xx, never a body that is not JSON."""
    r = httpx.post(f"{door}/v1/chat/completions", timeout=30, json={
        "model": "sim-a", "messages": [{"role": "user", "content": parts}], "max_tokens": 2})
    ok = all(well_formed(p) for p in parts)
    assert r.status_code == (200 if ok else 400), r.text
    if not ok:
        bad = next(i for i, p in enumerate(parts) if not well_formed(p))
        assert r.json()["error"]["param"].startswith(f"messages.0.content.{bad}")
