"""Placement wired into serving: `deploy` plans the replicas, pins each to its NVLink island through
its own Serve deployment, and every replica verifies where it landed.

A `ray.cluster_utils.Cluster` starts a head and two worker raylets shaped like the NVLink-pairs
fixture (two 4-GPU nodes, NV4 pairs GPU0-1 and GPU2-3), with fake GPUs and the bootstrap
labels/resources. The model is the simulated engine holding its GPUs (`sim.reserve_gpus`), TP=2,
two replicas, deployed with `hbmserve.cluster.ray_cluster.deploy` on that cluster.

Run under the shared lock: `flock /tmp/hbmserve-ray.lock .venv/bin/python -m pytest <this file>`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

import hbmserve.placement as placement_pkg
from hbmserve.cluster import ray_cluster as rc
from hbmserve.core.config import parse_cluster_spec
from hbmserve.deployments.wire.names import slot_deployment_name
from hbmserve.deployments.apps.placed_app import plan_model
from hbmserve.placement.bootstrap import NODE_LABEL
from hbmserve.placement.cluster_file import load_cluster_file
from tests.integration.placement_cluster import start_placement_cluster

ray = pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[cpu]')")

pytestmark = pytest.mark.integration

PAIRS = Path(placement_pkg.__file__).parent / "data" / "cluster_nvlink_pairs_x2.yaml"
PORT = 18300  # no other test uses it
ISLAND_OF_GPU = {0: 0, 1: 0, 2: 1, 3: 1}  # the fixture's NV4 pairs, by hand


def _spec(name: str, tp: int, replicas: int):
    return parse_cluster_spec({
        "serve": {"http": {"host": "127.0.0.1", "port": PORT}},
        "topology": str(PAIRS),
        "models": [{"name": name, "source": "/nonexistent", "engine": "sim", "replicas": replicas,
                    "parallelism": {"tp": tp}, "sim": {"reserve_gpus": True, "speedup": 50.0},
                    "engine_settings": {"max_model_len": 256, "max_num_seqs": 8}}],
    })


@pytest.fixture(scope="module")
def live():
    from ray import serve

    topology = load_cluster_file(PAIRS)
    cluster = start_placement_cluster(topology, timeout_s=40)
    try:
        rc.connect(cluster.address)
        yield topology
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            cluster.shutdown()


def _serve_group_nodes() -> dict[str, list[str]]:
    """Serve's placement groups as Ray's driver-side table sees them: deployment -> bundle nodes."""
    label_of = {n["NodeID"]: n.get("Labels", {}).get(NODE_LABEL) for n in ray.nodes()}
    out = {}
    for pg in ray.util.placement_group_table().values():
        if pg["state"] == "CREATED" and pg["name"].startswith("SERVE_REPLICA::"):
            deployment = pg["name"].split("#")[1]
            out[deployment] = [label_of[pg["bundles_to_node_id"][i]] for i in sorted(pg["bundles_to_node_id"])]
    return out


def _status_json() -> dict:
    """`hbmserve status --json`, in process (it reuses this process's connection to the cluster)."""
    import typer
    from typer.testing import CliRunner

    from hbmserve.cli.serve import register

    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, ["status", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_planned_replicas_land_on_their_islands_and_serve_one_endpoint(live):
    topology = live
    t0 = time.monotonic()
    spec = _spec("sim-tp2", tp=2, replicas=2)
    endpoints = rc.deploy(spec)
    assert endpoints == {"sim-tp2": f"http://127.0.0.1:{PORT}"}

    expected = plan_model(spec.models[0], topology)
    planned = {slot_deployment_name(spec.models[0], r.index): r.stages[0] for r in expected.replicas}
    # By hand: the replicas spread over both nodes, each TP pair inside one NV4 pair.
    assert sorted(s.node for s in planned.values()) == ["pairs-a", "pairs-b"]

    # Ray's own view: each deployment's bundles sit on its planned node.
    groups = _serve_group_nodes()
    assert {d: groups.get(d) for d in planned} == {d: [s.node] * 2 for d, s in planned.items()}

    (status,) = _status_json()["models"]
    assert status["replicas"] == {"RUNNING": 2}
    reports = sorted((r["placement"] for r in status["replica_stats"]), key=lambda p: p["replica"])
    assert [p["replica"] for p in reports] == [0, 1]
    for p, r in zip(reports, expected.replicas):
        assert p["placement_verified"] is True, p
        assert p["crossed"] == []
        stage = r.stages[0]
        assert [(o["node"], o["gpu"]) for o in p["observed"]] == list(zip([stage.node] * 2, stage.gpus))
        assert {ISLAND_OF_GPU[o["gpu"]] for o in p["observed"]} == {ISLAND_OF_GPU[stage.gpus[0]]}

    with httpx.Client(base_url=endpoints["sim-tp2"], timeout=30) as client:
        for _ in range(4):
            reply = client.post("/v1/completions", json={"model": "sim-tp2", "prompt": "hi", "max_tokens": 4})
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["text"]
    assert time.monotonic() - t0 < 90


def test_infeasible_plan_deploys_nothing(live):
    from ray import serve

    before_apps = set(serve.status().applications)  # empty, not an error, when Serve is not running
    before_groups = len(ray.util.placement_group_table())
    with pytest.raises(rc.ClusterError) as err:
        rc.deploy(_spec("sim-tp4", tp=4, replicas=1))
    message = str(err.value)
    assert "sim-tp4" in message and "largest here is 2" in message and "alternative:" in message
    assert len(ray.util.placement_group_table()) == before_groups
    assert set(serve.status().applications) == before_apps and "sim-tp4" not in before_apps


def test_a_replica_the_autoscaler_adds_lands_on_its_planned_island_and_verifies(live):
    """max_replicas 2 planned up front as two slot deployments; load (8 concurrent streams at a
    2-sequence engine: a queue of 6 past a target of 1 per replica, which one replica at the
    stated 0.05 rps cannot drain) takes the policy from 1 to 2 replicas, and the added replica,
    slot 1, reports itself verified on slot 1's planned island. (At 1 rps per replica the
    policy judged one replica enough to drain the queue for ~30 s: measured.)"""
    from concurrent.futures import ThreadPoolExecutor

    from ray import serve

    topology = live
    serve.shutdown()  # the apps of the tests above hold the islands this model is planned on
    t0 = time.monotonic()
    spec = parse_cluster_spec({
        "serve": {"http": {"host": "127.0.0.1", "port": PORT}},
        "topology": str(PAIRS),
        "models": [{"name": "sim-auto", "source": "/nonexistent", "engine": "sim", "parallelism": {"tp": 2},
                    "sim": {"reserve_gpus": True}, "slo": {"ttft_p95_ms": 60000, "tpot_p95_ms": 1000},
                    "engine_settings": {"max_model_len": 1024, "max_num_seqs": 2},
                    "autoscaling": {"min_replicas": 1, "max_replicas": 2, "target_queue_per_replica": 1,
                                    "replica_capacity_rps": 0.05, "reestimate_capacity": False,
                                    "upscale_delay_s": 0, "hot_standby": {"min": 0, "max": 0},
                                    "startup_s": {"hot": 1, "warm": 2, "cold": 4}}}],
    })
    url = rc.deploy(spec)["sim-auto"]
    planned = plan_model(spec.models[0], topology).replicas
    assert _status_json()["models"][0]["replicas"] == {"RUNNING": 1}  # slot 0 only: the floor

    stop = time.monotonic() + 60

    def stream(_):
        with httpx.Client(base_url=url, timeout=60) as client:
            while time.monotonic() < stop:
                client.post("/v1/completions", json={"model": "sim-auto", "prompt": "hi", "max_tokens": 300})

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(stream, i) for i in range(8)]
        while time.monotonic() < stop:
            status = _status_json()["models"][0]
            added = [r for r in status["replica_stats"] if r["placement"]["replica"] == 1]
            if added:
                break
            time.sleep(1)
        stop = 0.0  # the streams finish their current request and end
        for f in futures:
            f.result()
    decision = status["autoscale"]
    assert decision is not None and decision["serve_target"] == 2, decision
    (report,) = [r["placement"] for r in added]
    assert report["placement_verified"] is True, report
    stage = planned[1].stages[0]
    assert [(o["node"], o["gpu"]) for o in report["observed"]] == list(zip([stage.node] * 2, stage.gpus))
    assert {ISLAND_OF_GPU[o["gpu"]] for o in report["observed"]} == {ISLAND_OF_GPU[stage.gpus[0]]}
    # Ray's own view: slot 1's bundles sit on its planned node; both replicas take traffic.
    assert _serve_group_nodes().get(slot_deployment_name(spec.models[0], 1)) == [stage.node] * 2
    deadline = time.monotonic() + 10  # the added replica is promoted on the policy's next tick
    while len(decision["active_replicas"]) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
        decision = _status_json()["models"][0]["autoscale"]
    assert len(decision["active_replicas"]) == 2, decision
    assert time.monotonic() - t0 < 90
