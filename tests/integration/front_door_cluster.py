"""The cluster tests/integration/test_front_door.py serves: its config, keys and tenants, and the
long streams its fault tests run through it, and where a replica runs in Ray."""

from __future__ import annotations

import json
import threading

import httpx

from hbmserve.core.config import parse_cluster_spec

PORT = 18400
KEY_A, KEY_B, ADMIN = "tenant-a-key-0123456789", "tenant-b-key-0123456789", "admin-token-0123456789"
A, B = {"authorization": f"Bearer {KEY_A}"}, {"authorization": f"Bearer {KEY_B}"}
ADMIN_H = {"authorization": f"Bearer {ADMIN}"}
KEY_C, KEY_D = "tenant-c-key-0123456789", "tenant-d-key-0123456789"
C_TOKENS_PER_MINUTE = 3000  # team-c's limit: for the whole cluster, whichever doors its clients reach
# 2x real time: a token every ~3.5 ms, so a long stream lasts seconds (long enough to kill its
# replica mid-way) while a short request takes ~0.1 s.
SIM = {"gpu": "h100-sxm", "model_config_name": "llama-3.1-8b", "speedup": 2.0}


def cluster_spec(keys_file, admin_file):
    return parse_cluster_spec({
        "name": "hbmserve-frontdoor-test",
        # Every client of these tests is 127.0.0.1: the per-address socket cap (64) would count
        # a hundred test clients as one (tests/unit/deployments/wire/test_connection_caps.py tests that cap).
        "serve": {"http": {"host": "127.0.0.1", "port": PORT, "header_timeout_s": 2, "body_timeout_s": 2,
                           "max_body_bytes": 65536, "max_connections_per_client": 4096},
                  "auth": {"keys_file": str(keys_file), "admin_token_file": str(admin_file)}},
        "models": [
            {"name": "sim-a", "source": "sim", "engine": "sim", "replicas": 2, "sim": SIM, "max_replicas_per_node": 1,
             "engine_settings": {"max_model_len": 2048, "max_num_seqs": 4}},
            {"name": "sim-b", "source": "sim", "engine": "sim", "replicas": 1, "sim": SIM,
             "engine_settings": {"max_model_len": 2048, "max_num_seqs": 4}},
        ]})


def keys_text(team_c_key: str) -> str:
    return (f"tenants:\n  - {{name: team-a, keys: ['{KEY_A}'], priority: 1}}\n"
            f"  - {{name: team-b, keys: ['{KEY_B}'], requests_per_minute: 600}}\n"
            f"  - {{name: team-c, keys: ['{team_c_key}'], tokens_per_minute: {C_TOKENS_PER_MINUTE}}}\n")


class Started(threading.Event):
    """Set once a stream has sent a few tokens; `replica` names the replica it started on."""

    replica = ""


def stream_text(url: str, tokens: int, started: Started | None = None) -> tuple[str, bool, str]:
    """One long streamed completion: (its text, whether it ended with [DONE], its replica)."""
    body = {"model": "sim-a", "prompt": "a long answer", "max_tokens": tokens, "stream": True}
    text, done = "", False
    with httpx.Client(timeout=60) as c, c.stream("POST", f"{url}/v1/completions", headers=A, json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                assert "error" not in event, event
                text += "".join(c["text"] for c in event["choices"])
                if started is not None and len(text) > 40:
                    started.replica = r.headers["x-hbmserve-replica"]
                    started.set()
        return text, done, r.headers["x-hbmserve-replica"]


def actor_of(replica_id: str):
    """The Serve replica actor with this replica id (Serve names them APP#DEPLOYMENT#ID)."""
    import ray

    (name,) = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].endswith(f"#{replica_id}")]
    return ray.get_actor(name, namespace="serve")


def node_of(replica_id: str) -> str:
    """The node a Serve replica runs on (the x-hbmserve-replica header names the replica only).
    Ray's state API needs the dashboard, which this cluster leaves out: ask the GCS's actor table."""
    from ray._private.state import actors

    return actors(actor_of(replica_id)._actor_id.hex())["Address"]["NodeID"]
