"""The warm tier live, on Ray's own autoscaling test cluster (`ray.cluster_utils.AutoscalingCluster`:
Ray's node autoscaler launching fake nodes, each a real raylet on this machine).

A head with no GPU and a worker type with one (fake) GPU, 0 to 2 of them. One simulated model
whose replica holds a GPU, scale to zero, a warm pool of one node, and weights served by an HTTP
server started here that counts every file it sends. The policy wants one warm node; the
aggregator turns that into a `request_resources` call, Ray's autoscaler adds a node, and the
aggregator's prefetch fills that node's cache from the source. Then a burst of requests scales the
model from 0 to 1: the replica lands on the prefetched node and starts from its cache (a hit),
and the source sends no model file after the prefetch.

The fake nodes share this machine's disk, so they share one cache root: the check that the
replica started from the cache is the source's count (no file after the prefetch) and the
replica's own report, on the node the prefetch ran on.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.integration
MODEL = "warm-sim"
PORT = 18450
MANIFEST = "hbmserve-manifest.json"


class CountingSource:
    """Model files over HTTP at /m/<path>, counting the GETs of each path."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.gets, self.lock = files, [], threading.Lock()
        state = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                return None

            def do_GET(self):  # noqa: N802
                path = self.path.removeprefix("/m/")
                with state.lock:
                    state.gets.append(path)
                body = state.files.get(path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/m"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def model_file_gets(self) -> int:
        with self.lock:
            return sum(1 for p in self.gets if p != MANIFEST)


def _files() -> dict[str, bytes]:
    from hbmserve.weights.manifest import FileEntry, make_manifest

    files = {"config.json": b"{}", "model.safetensors": hashlib.shake_256(b"warm").digest(200_000)}
    entries = [FileEntry(p, len(b), "sha256:" + hashlib.sha256(b).hexdigest()) for p, b in files.items()]
    return {**files, MANIFEST: make_manifest(entries).to_json().encode()}


def _cluster_class():
    from ray.cluster_utils import AutoscalingCluster

    class FakeNodeCluster(AutoscalingCluster):
        """Ray 2.60's wheel lacks the fake_multi_node example.yaml that AutoscalingCluster builds
        its config from; the same config, stated here."""

        def _generate_config(self, head_resources, worker_node_types, autoscaler_v2=False, **kw):
            return {"cluster_name": "hbmserve-warm", "max_workers": 2, "head_node_type": "ray.head.default",
                    "provider": {"type": "fake_multinode", "use_node_id_as_ip": True,
                                 "disable_node_updaters": True, "disable_launch_config_check": True},
                    "available_node_types": {**worker_node_types, "ray.head.default": {
                        "resources": dict(head_resources), "node_config": {}, "max_workers": 0}},
                    "auth": {}, "upscaling_speed": 1.0, "idle_timeout_minutes": 1.0, "docker": {},
                    "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
                    "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
                    "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
                    "rsync_exclude": [], "rsync_filter": [], **kw}

    return FakeNodeCluster


def _config(tmp: Path, source: str) -> Path:
    cfg = tmp / "cluster.yaml"
    cfg.write_text(f"""name: hbmserve-warm-test
serve: {{http: {{host: 127.0.0.1, port: {PORT}}}}}
cache: {{root: {tmp / 'cache'}, max_gib: 1, min_free_gib: 0}}
models:
  - name: {MODEL}
    source: {source}
    engine: sim
    engine_settings: {{max_model_len: 4096, max_num_seqs: 8, max_num_batched_tokens: 2048}}
    sim: {{gpu: h100-sxm, model_config_name: llama-3.1-8b, speedup: 5, startup_s: 1,
           reserve_gpus: true, cache_weights: true}}
    autoscaling:
      min_replicas: 0
      max_replicas: 2
      startup_s: {{hot: 1, warm: 2, cold: 30}}
      upscale_delay_s: 1
      downscale_delay_s: 600
      downscale_cooldown_s: 600
      hot_standby: {{min: 0, max: 0}}
      warm_pool: {{min: 1, max: 1}}
""")
    return cfg


def _until(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        time.sleep(0.5)


@pytest.fixture
def fake_node_cluster(monkeypatch):
    # AutoscalingCluster runs `ray start`/`ray stop` from PATH: this environment's.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cluster = _cluster_class()(
        head_resources={"CPU": 2},
        worker_node_types={"gpu-node": {"resources": {"CPU": 1, "GPU": 1}, "node_config": {},
                                        "min_workers": 0, "max_workers": 2}})
    cluster.start()
    try:
        yield cluster
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


def test_a_burst_lands_on_a_prefetched_warm_node_and_starts_from_its_cache(fake_node_cluster, tmp_path):
    import ray
    from ray import serve

    from hbmserve.cluster import ray_cluster as rc
    from hbmserve.core.config import load_cluster_spec
    from hbmserve.deployments.wire.records_store import latest_decision, latest_warm_tier, read_replica_info
    from hbmserve.deployments.wire.names import engine_deployment_name

    source = CountingSource(_files())
    spec = load_cluster_spec(_config(tmp_path, source.url))
    ray.init(address="auto", namespace=rc.NAMESPACE, log_to_driver=False)
    head = ray.get_runtime_context().get_node_id()
    rc.deploy(spec)  # scale to zero: returns once the front door serves

    # The policy's warm wish (1 node) becomes the one request, and Ray's autoscaler adds the node.
    tier = _until(lambda: (t := latest_warm_tier()) and t.node_autoscaler and t.bundles and t, 30,
                  "the aggregator asks for the warm node")
    assert tier.bundles == ({"GPU": 1.0},), tier.reason
    prefetched = _until(lambda: [p for p in latest_warm_tier().prefetched if p.ok and p.model == MODEL], 60,
                        "a node joins and the prefetch fills its cache")
    warm_nodes = {p.node_id for p in prefetched}
    assert head not in warm_nodes and not prefetched[0].hit and prefetched[0].bytes_fetched > 200_000
    fetched = source.model_file_gets()
    assert fetched == 2  # both files, once
    deployment = engine_deployment_name(spec.model(MODEL))
    assert latest_decision(MODEL, deployment).target_active == 0  # no replica yet: only the warm node

    # A burst: the front door holds the requests, the policy scales 0 -> 1.
    def complete(i: int) -> int:
        r = httpx.post(f"http://127.0.0.1:{PORT}/v1/completions", timeout=90,
                       json={"model": MODEL, "prompt": f"burst {i}", "max_tokens": 8})
        return r.status_code

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(complete, range(4))) == [200] * 4

    with rc._closing(serve.get_deployment_handle(deployment, app_name=MODEL)) as handle:
        info = read_replica_info(handle.info.remote().result(timeout_s=30))
    assert info.node_id in warm_nodes, "the replica did not land on the prefetched node"
    assert info.weights_cached is True
    assert source.model_file_gets() == fetched, "the replica fetched from the source"
    # With a replica serving, the request holds it and a new warm node (1 active + 1 warm).
    grown = _until(lambda: len(latest_warm_tier().bundles) == 2 and latest_warm_tier(), 15,
                   "the request grows to the replica plus a warm node")
    assert "warm 1" in grown.reason
