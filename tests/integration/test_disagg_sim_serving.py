"""A disaggregated model end to end with the simulated engine (issue 23 req 6): `hbmserve up` on a
real Ray head runs "Llama-3.1-70B on H100 TP=4" as 2 prefill + 4 decode replicas (two Serve
deployments of one application), and the `openai` SDK streams through the one endpoint under
load. Every request is prefilled on the prefill pool and decoded on the decode pool, which loads
the prompts' KV (the simulated connector charges its transfer); a prefill replica killed under
load costs no request; status and /metrics show the pools.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hbmserve.cluster.local_head import local_head_env

pytestmark = pytest.mark.integration
MODEL = "llama-70b-split"
PORT = 18170
STREAMS = 240
CONCURRENT = 24
PROMPT = "the model and its cache live in HBM, which is small, expensive and slow to fill. " * 20


@pytest.fixture(scope="module")
def served(head, tmp_path_factory):
    cfg = tmp_path_factory.mktemp("disagg-config") / "cluster.yaml"
    cfg.write_text(f"""name: hbmserve-disagg-test
serve: {{http: {{host: 127.0.0.1, port: {PORT}}}}}
models:
  - name: {MODEL}
    source: simulated
    engine: sim
    engine_settings: {{max_model_len: 4096, max_num_seqs: 16, max_num_batched_tokens: 2048}}
    sim: {{gpu: h100-sxm, model_config_name: llama-3.1-70b, speedup: 5}}
    disaggregation:
      prefill: {{replicas: 2, parallelism: {{tp: 4}}}}
      decode: {{replicas: 4, parallelism: {{tp: 4}}}}
      connector: {{kind: sim, link: nvlink}}
""")
    with head(cfg, PORT) as running:
        yield running


def _stream(client: openai.OpenAI, i: int) -> tuple[int, int, str]:
    stream = client.completions.create(model=MODEL, prompt=f"{i} {PROMPT}", max_tokens=64, stream=True,
                                       stream_options={"include_usage": True})
    text, usage = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].text
        if chunk.usage is not None:
            usage = chunk.usage
    return usage.completion_tokens, len(text.split(" ")), stream.response.headers.get("x-hbmserve-replica", "")


def _door_metrics(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


class PrefillKiller:
    """A process connected to the running head, holding one prefill replica's actor, that kills
    it (as a crash would; Serve restarts it) when told: connecting takes seconds, the kill not."""

    CODE = ("import ray, sys\nray.init(address='auto', namespace='serve', logging_level='ERROR')\n"
            "from ray.util.state import list_actors\n"
            "name = next(a.name for a in list_actors(filters=[('state', '=', 'ALIVE')], limit=1000)\n"
            "            if '-prefill#' in (a.name or ''))\n"
            "actor = ray.get_actor(name, namespace='serve')\nprint('READY', flush=True)\nsys.stdin.readline()\n"
            "ray.kill(actor, no_restart=False)\nprint(name, flush=True)\n")

    def __enter__(self):
        import os

        self.proc = subprocess.Popen([sys.executable, "-c", self.CODE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=os.environ | local_head_env())
        assert self.proc.stdout.readline().strip() == "READY"
        return self

    def kill(self) -> str:
        self.proc.stdin.write("kill\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def __exit__(self, *exc):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def test_two_pools_serve_streams_under_load_through_one_endpoint_and_survive_a_prefill_replica_lost(
        served, status):
    client = openai.OpenAI(base_url=f"{served['url']}/v1", api_key="unused", timeout=120, max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]
    killed: list[tuple[str, float]] = []
    with PrefillKiller() as killer:
        timer = threading.Timer(1.0, lambda: killed.append((killer.kill(), time.monotonic())))
        t0 = time.monotonic()
        timer.start()
        with ThreadPoolExecutor(CONCURRENT) as pool:
            results = list(pool.map(lambda i: _stream(client, i), range(STREAMS)))
        ended = time.monotonic()
        timer.join()
    wall = ended - t0
    assert killed and "prefill" in killed[0][0] and killed[0][1] < ended, "a prefill replica was killed under load"
    assert all(n == 64 and words == 64 for n, words, _ in results), results
    served_by = {replica for _, _, replica in results}
    entry = status(MODEL)
    assert sum(entry["replicas"].values()) >= 6 and entry["replicas"].get("RUNNING", 0) >= 5, entry["replicas"]
    (door,) = entry["traffic"]
    outcomes = dict(door["two_phase"])
    assert door["prefill_routable"] >= 1 and door["routable"] == 4, door
    # Every request ran: most in two phases; those the dead prefill replica dropped were prefilled
    # again elsewhere (prefill_failed) or, if none answered, ran whole (aggregated_*).
    assert sum(n for k, n in outcomes.items() if k != "prefill_failed") == STREAMS, outcomes
    assert outcomes.get("two_phase", 0) >= STREAMS * 0.9, outcomes
    metrics = _door_metrics(served["url"])
    loaded = sum(v for (name, labels), v in metrics.items()
                 if name == "hbmserve_external_prefix_cache_hits_total" and ("pool", "decode") in labels)
    assert loaded >= outcomes["two_phase"] * 100, "the decode pool loaded the prompts' KV"
    assert not any(name == "hbmserve_external_prefix_cache_hits_total" and ("pool", "prefill") in labels and v
                   for (name, labels), v in metrics.items()), "the prefill pool computed its prompts"
    print(json.dumps({"streams": STREAMS, "wall_s": round(wall, 1), "outcomes": outcomes,
                      "decode_replicas_serving": len(served_by), "kv_tokens_loaded": loaded}))
