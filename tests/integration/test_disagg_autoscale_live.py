"""Two pools, one decision, live (issue 23 req 5): a disaggregated simulated model whose prefill
and decode pools both autoscale (1..3 each) runs on a real Ray Serve, and long prompts through
the front door pile up on the one prefill replica. The decode pool's policy decides for both
(deployments/control/pool_autoscaling.py): the prompt-token backlog grows the prefill pool, both
deployments' published decisions carry the one joint reason, and every request completes.

The simulated engine runs at a quarter of the modelled speed (`sim.speedup: 0.25`), so one
prefill replica computes about 3,600 prompt tokens a second (the capacity model's figure for
70B on four H100s, times the speedup, which the policy is given) and 3,000-token prompts queue
at a handful in flight. Owns the local head for the module: `down` before and after.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from hbmserve.cluster.local_head import local_head_env
from hbmserve.deployments.wire.names import engine_deployment_name

pytestmark = pytest.mark.integration
MODEL = "llama-70b-pools"
PORT = 18230
PROMPT_TOKENS = 3_000
MAX_TOKENS = 8
CONCURRENT = 12
REQUESTS = 48
DEPLOYMENTS = [engine_deployment_name(MODEL, role) for role in ("prefill", "decode")]


# Both pools 1..3, quick to grow, slow to shrink (the test watches the way up).
POOL = {"autoscaling": {"min_replicas": 1, "max_replicas": 3, "upscale_delay_s": 1, "downscale_delay_s": 60,
                        "startup_s": {"hot": 1, "warm": 3, "cold": 6}},
        "parallelism": {"tp": 4}}
CONFIG = {"name": "hbmserve-pools-test", "serve": {"http": {"host": "127.0.0.1", "port": PORT}},
          "models": [{"name": MODEL, "source": "simulated", "engine": "sim",
                      "engine_settings": {"max_model_len": 4096, "max_num_seqs": 16, "max_num_batched_tokens": 2048},
                      "sim": {"gpu": "h100-sxm", "model_config_name": "llama-3.1-70b", "speedup": 0.25,
                              "startup_s": 0.25},
                      "slo": {"ttft_p95_ms": 4000, "tpot_p95_ms": 1000},
                      "disaggregation": {"prefill": POOL, "decode": POOL,
                                         "connector": {"kind": "sim", "link": "nvlink"}}}]}


@pytest.fixture(scope="module")
def served(head, tmp_path_factory):
    cfg = tmp_path_factory.mktemp("pools-config") / "cluster.yaml"
    cfg.write_text(json.dumps(CONFIG, indent=2))  # JSON is YAML
    with head(cfg, PORT) as running:
        yield running["url"]


def _prompt(i: int) -> str:
    """About PROMPT_TOKENS tokens to the simulated engine (4 bytes a token), unlike any other
    request's from its first block, so no prefix cache shortens a prefill."""
    rng = random.Random(i)
    words = []
    while sum(len(w) + 1 for w in words) < PROMPT_TOKENS * 4:
        words.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9))))
    return " ".join(words)


def _complete(url: str, i: int) -> int:
    """One completion; a 429 is retried after its Retry-After, as an OpenAI client does."""
    body = {"model": MODEL, "prompt": _prompt(i), "max_tokens": MAX_TOKENS}
    with httpx.Client(timeout=120) as client:
        for _ in range(60):
            r = client.post(f"{url}/v1/completions", json=body)
            if r.status_code != 429:
                assert r.status_code == 200, r.text
                return r.json()["usage"]["completion_tokens"]
            time.sleep(int(r.headers.get("retry-after", "1")))
    raise AssertionError("refused 60 times")


READ_DECISIONS = (
    "import json, ray, sys\n"
    "ray.init(address='auto', logging_level='ERROR')\n"
    "from hbmserve.deployments.wire.records_store import recent_decisions\n"
    "app, deps = sys.argv[1], sys.argv[2:]\n"
    "print(json.dumps({d: [r.to_dict() for r in recent_decisions(app, d)] for d in deps}))\n")


def _decisions() -> dict[str, list[dict]]:
    """Each pool deployment's plan-changing decisions, oldest first, from the head's KV."""
    out = subprocess.run([sys.executable, "-c", READ_DECISIONS, MODEL, *DEPLOYMENTS], capture_output=True,
                         text=True, timeout=120, env=os.environ | local_head_env())
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_prompt_backlog_grows_the_prefill_pool_in_one_decision_with_the_decode_pool(served):
    t0 = time.monotonic()
    with ThreadPoolExecutor(CONCURRENT) as pool:
        completed = list(pool.map(lambda i: _complete(served, i), range(REQUESTS)))
    wall = time.monotonic() - t0
    assert completed == [MAX_TOKENS] * REQUESTS
    decisions = _decisions()
    prefill, decode = (decisions[d] for d in DEPLOYMENTS)
    assert prefill and decode, decisions
    for d in prefill + decode:
        # One joint reason: both actions first, then each pool's signals.
        own, joint = d["reason"].split(" | ", 1)
        assert own.split(" ", 1)[0] in ("up", "down", "hold"), d["reason"]  # the pool's own action leads
        assert joint.startswith("prefill ") and "; decode " in joint, d["reason"]
        assert " | prefill: prompt backlog " in d["reason"] and " | decode: kv " in d["reason"], d["reason"]
    grown = [d for d in prefill if len(d["active_replicas"]) >= 2]
    assert grown, [(d["serve_target"], d["active_replicas"]) for d in prefill]
    backlog = [d for d in prefill if d["serve_target"] >= 2 and "prefill up" in d["reason"]]
    assert backlog, [d["reason"] for d in prefill]
    # The prompt backlog, counted in tokens, asked for the replicas (its own need in the reason).
    needs = [int(re.search(r"\| prefill: prompt backlog [\d,]+ tokens at [\d,]+ tokens/s per replica "
                           r"\(need (\d+)\)", d["reason"]).group(1)) for d in backlog]
    assert max(needs) >= 2, [d["reason"] for d in backlog]
    print(json.dumps({"requests": REQUESTS, "wall_s": round(wall, 1),
                      "prefill_targets": [d["serve_target"] for d in prefill],
                      "decode_targets": [d["serve_target"] for d in decode],
                      "first_prefill_up": backlog[0]["reason"][:400]}))
