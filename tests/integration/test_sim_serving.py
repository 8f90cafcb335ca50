"""End to end with the simulated engine: a real Ray head and Serve running three "Llama-3.1-70B on
H100 TP=4" replicas on this machine's CPUs, one shared endpoint, through the `openai` SDK.

Last, `ray job submit --working-dir . -- hbmserve deploy CONFIG` redeploys the same config on
this head, as a CI pipeline would: simulated replicas restart in seconds where a vLLM-CPU one
takes a minute, and the job path does not depend on the engine.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from hbmserve.cluster.local_head import outward_address
from tests.integration.ray_ports import accepts_unauthenticated, listeners

pytestmark = pytest.mark.integration
MODEL = "llama-70b-sim"
PORT = 18100  # not the vLLM fixture's 18000
REPLICAS = 3
CONCURRENT = 30


@pytest.fixture(scope="module")
def sim_config(tmp_path_factory):
    cfg = tmp_path_factory.mktemp("sim-config") / "cluster.yaml"
    cfg.write_text(
        f"""name: hbmserve-sim-test
serve: {{http: {{host: 127.0.0.1, port: {PORT}}}}}
models:
  - name: {MODEL}
    source: simulated
    engine: sim
    replicas: {REPLICAS}
    parallelism: {{tp: 4}}
    engine_settings: {{max_model_len: 4096, max_num_seqs: 16, max_num_batched_tokens: 1024}}
    sim: {{gpu: h100-sxm, model_config_name: llama-3.1-70b, speedup: 20}}
"""
    )
    return cfg


@pytest.fixture(scope="module")
def sim_served(head, sim_config):
    with head(sim_config, PORT) as running:
        yield running


@pytest.fixture(scope="module")
def client(sim_served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{sim_served['url']}/v1", api_key="unused", timeout=60, max_retries=0)


def test_up_serves_the_simulated_model(sim_served):
    assert f"serving {MODEL} at {sim_served['url']}/v1" in sim_served["stdout"]


def test_models_lists_the_model(client):
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_chat_completion(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=8)
    assert r.choices[0].finish_reason == "length"
    assert len(r.choices[0].message.content.split(" ")) == 8
    assert r.usage.completion_tokens == 8 and r.usage.prompt_tokens >= 1


def test_completion(client):
    r = client.completions.create(model=MODEL, prompt="the model and its cache", max_tokens=6)
    assert r.usage.completion_tokens == 6 and len(r.choices[0].text.split(" ")) == 6


def test_streaming_chat_delivers_every_token_and_ends(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "stream please"}], max_tokens=12, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)  # the SDK's iterator only ends on `data: [DONE]`
    content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(content) == 12 and finish == ["length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12


def test_unknown_model_and_too_long_are_openai_errors(client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=4)
    assert "no-such-model" in missing.value.body["message"]
    with pytest.raises(openai.BadRequestError) as too_long:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=10_000)
    assert "max_tokens" in too_long.value.body["message"] and "4096" in too_long.value.body["message"]


def test_status_shows_three_running_replicas_on_one_endpoint(status, sim_served):
    model = status()
    assert model["app_status"] == "RUNNING"
    assert model["replicas"] == {"RUNNING": REPLICAS}
    assert model["endpoints"] == [sim_served["url"]]
    assert len(model["replica_stats"]) == REPLICAS


def test_concurrent_requests_all_succeed_and_spread_over_replicas(status, sim_served):
    before = {r["replica"]: r["accepted"] for r in status()["replica_stats"]}

    def one(i: int) -> int:
        # A fresh connection per request, as separate clients would come.
        with httpx.Client(base_url=sim_served["url"], timeout=60) as c:
            r = c.post("/v1/completions", json={"model": MODEL, "prompt": f"request {i}", "max_tokens": 16})
            assert r.status_code == 200, r.text
            return r.json()["usage"]["completion_tokens"]

    with ThreadPoolExecutor(max_workers=CONCURRENT) as pool:
        tokens = list(pool.map(one, range(CONCURRENT)))
    assert tokens == [16] * CONCURRENT

    after = status()["replica_stats"]
    served = {r["replica"]: r["accepted"] - before.get(r["replica"], 0) for r in after}
    assert sum(served.values()) == CONCURRENT
    assert sum(1 for n in served.values() if n > 0) >= 2, served
    assert all(r["rejected"] == 0 and r["in_flight"] == 0 for r in after)


def test_job_submit_deploys_config_from_working_dir(sim_served, tmp_path, venv_bin, cli):
    workdir = tmp_path / "job"
    workdir.mkdir()
    shutil.copy(sim_served["config"], workdir / "cluster.yaml")
    job = [str(venv_bin / "ray"), "job", "submit", "--address", "http://127.0.0.1:8265",
           "--working-dir", str(workdir), "--", "hbmserve", "deploy", "cluster.yaml"]
    # The head runs with Ray's token auth: without the README's one step, Ray's CLI is refused.
    plain = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    refused = subprocess.run(job, capture_output=True, text=True, timeout=120, env=plain)
    assert refused.returncode != 0 and "Authentication required" in refused.stdout + refused.stderr, refused.stderr
    # The step: eval "$(hbmserve ray-env)".
    lines = cli("ray-env", timeout=60).stdout.splitlines()
    exported = dict(shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in lines)
    assert exported["RAY_AUTH_MODE"] == "token"
    r = subprocess.run(job, capture_output=True, text=True, timeout=600, env=plain | exported)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "succeeded" in out.lower()
    assert f"serving {MODEL} at {sim_served['url']}/v1" in out
    # The same config again: nothing restarts, and the deployment serves on the same endpoint.
    assert f"unchanged, left running: {MODEL}" in out
    resp = httpx.post(f"{sim_served['url']}/v1/completions", timeout=60,
                      json={"model": MODEL, "prompt": "hello", "max_tokens": 3})
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 3


def test_a_changed_model_section_rolls_replica_by_replica_as_the_readme_says(sim_served, cli, tmp_path):
    """`hbmserve deploy` of an edited config onto the running cluster: the model rolls to a new
    version one replica at a time within its 3 replicas, the front door stays, and status says so."""
    changed = tmp_path / "cluster.yaml"
    changed.write_text(sim_served["config"].read_text().replace("speedup: 20", "speedup: 25")
                       .replace("max_model_len: 4096", "max_model_len: 3072"))
    r = cli("deploy", str(changed), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{MODEL} rollout {MODEL} -> {MODEL}@2: rolled to {MODEL}@2" in r.stdout
    assert f"at most 3 replicas held (fleet {REPLICAS})" in r.stdout
    assert f"serving {MODEL} at {sim_served['url']}/v1" in r.stdout
    (rollout,) = json.loads(cli("status", "--json", timeout=120).stdout)["rollouts"]
    assert rollout["phase"] == "done" and [s["new_replicas"] for s in rollout["steps"]][-1] == REPLICAS
    resp = httpx.post(f"{sim_served['url']}/v1/completions", timeout=60,
                      json={"model": MODEL, "prompt": "hello", "max_tokens": 3})
    assert resp.status_code == 200 and resp.headers["x-hbmserve-replica"]
    # The front door, never restarted, takes the new section once the rollout is done.
    deadline = time.monotonic() + 10
    while httpx.get(f"{sim_served['url']}/v1/models", timeout=10).json()["data"][0]["max_model_len"] != 3072:
        assert time.monotonic() < deadline, "the front door kept the old max_model_len"
        time.sleep(0.2)


def test_no_port_the_default_up_opened_takes_an_unauthenticated_ray_call(sim_served):
    """Every listener `up` added, probed from this machine's outside address as a stranger on the
    network would: a token-less gRPC call and a token-less dashboard request."""
    outside = outward_address()
    if outside is None:
        pytest.skip("this machine has no non-loopback address to probe from")
    added = sorted(listeners() - sim_served["listening_before"], key=lambda x: x.port)
    assert added, "`up` opened no listener at all?"
    report = {f"{x.address} {x.process}": ("loopback only" if x.loopback_only
                                           else accepts_unauthenticated(outside, x.port) or "refused without a token")
              for x in added}
    print(json.dumps(report, indent=1))
    accepted = {k: v for k, v in report.items() if v not in ("loopback only", "refused without a token")}
    assert accepted == {}, report


def test_serve_replicas_run_at_the_priority_of_rays_daemons(sim_served):
    """`hbmserve up` starts Ray's workers at nice 0 (cluster/local_head.py SERVING_ENV): the front
    door and every engine replica, not Ray's default 15 below its own daemons."""
    import psutil

    def nice_of(marker: str) -> list[int]:
        out = []
        for p in psutil.process_iter(["cmdline"]):
            try:
                if marker in " ".join(p.info["cmdline"] or []):
                    out.append(p.nice())
            except psutil.NoSuchProcess:
                continue
        return out

    door, replicas = nice_of("ServeReplica:hbmserve-frontdoor"), nice_of(f"ServeReplica:{MODEL}")
    assert door and len(replicas) >= REPLICAS
    assert set(door + replicas) == {0}
