"""Live: what a hot standby buys when a burst arrives, against starting a replica (issue 5, req. 2).

Real Ray Serve, hbmserve's policy, simulated-engine replicas ("70B on H100, TP=4", 4 sequences
per replica) whose simulated load takes `--load-s` seconds (a warm start: weights on local NVMe,
scaled down to keep the run short). Two configs, side by side, `--rounds` times each:

* `standby`:  min 1 replica + 1 hot standby (engine loaded, out of rotation);
* `no-standby`: min 1 replica; extra capacity only from new replicas (what a Serve deployment
  with the stock policy has).

Each round: a fresh local head, the config deployed, then a burst of `--clients` concurrent
streamed requests, each client sending `--per-client` requests in a row. Measured from the
burst's start, reading the policy's published decision every 0.1 s: when it first asks for a
second active replica, and when a second replica is assigned traffic; and TTFT p50/p95/max over
the burst. Medians over rounds ("never": not within the burst).

    .venv/bin/python -m hbmserve.ops.bench.live_standby --rounds 3 --out out/live_standby.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from hbmserve.cluster import local_head as lh, ray_cluster as rc
from hbmserve.core.config import load_cluster_spec

MODEL = "bench-standby"
PORT = 18400


def _config(load_s: float, standby: int) -> str:
    return f"""name: hbmserve-standby-bench
serve: {{http: {{host: 127.0.0.1, port: {PORT}}}}}
models:
  - name: {MODEL}
    source: simulated
    engine: sim
    parallelism: {{tp: 4}}
    engine_settings: {{max_model_len: 4096, max_num_seqs: 4, max_num_batched_tokens: 2048}}
    sim: {{gpu: h100-sxm, model_config_name: llama-3.1-70b, speedup: 1, startup_s: {load_s}}}
    slo: {{ttft_p95_ms: 2000, tpot_p95_ms: 100}}
    autoscaling:
      min_replicas: 1
      max_replicas: 3
      target_queue_per_replica: 2
      replica_capacity_rps: 1.0
      startup_s: {{hot: 1, warm: {load_s}, cold: {load_s * 3}}}
      upscale_delay_s: 1
      downscale_delay_s: 30
      downscale_cooldown_s: 30
      hot_standby: {{min: {standby}, max: {standby}}}
"""


def _ttft(url: str, max_tokens: int) -> float:
    body = {"model": MODEL, "prompt": "burst", "max_tokens": max_tokens, "stream": True}
    t0 = time.monotonic()
    with httpx.Client(timeout=300) as c, c.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        first = None
        for line in r.iter_lines():
            if first is None and line.startswith("data: {"):
                first = time.monotonic() - t0
        return first if first is not None else float("nan")


def _watch_second_active(app: str, dep: str, t0: float, stop: threading.Event, out: dict) -> None:
    from hbmserve.deployments.wire.records_store import latest_decision

    while not stop.is_set():
        d = latest_decision(app, dep)
        if d is not None and d.target_active >= 2 and "scale_up_s" not in out:
            out["scale_up_s"] = time.monotonic() - t0
            out["reason"] = d.reason
        if d is not None and len(d.active_replicas) >= 2 and "second_active_s" not in out:
            out["second_active_s"] = time.monotonic() - t0
        time.sleep(0.1)


def one_round(config_path: str, clients: int, per_client: int, max_tokens: int) -> dict:
    spec = load_cluster_spec(config_path)
    lh.stop_local_head()
    lh.start_local_head(spec.serve.dashboard_port)
    try:
        rc.connect(None)
        url = rc.deploy(spec)[MODEL]
        time.sleep(5)  # let the first decision assign roles and the standby (if any) settle
        from hbmserve.deployments.wire.names import engine_deployment_name

        out: dict = {}
        stop = threading.Event()
        t0 = time.monotonic()
        dep = engine_deployment_name(spec.models[0])
        watcher = threading.Thread(target=_watch_second_active, args=(MODEL, dep, t0, stop, out))
        watcher.start()
        with ThreadPoolExecutor(clients) as pool:
            ttfts = list(pool.map(lambda _: _ttft(url, max_tokens), range(clients * per_client)))
        stop.set()
        watcher.join()
        ttfts.sort()
        return {"scale_up_s": out.get("scale_up_s"), "second_active_s": out.get("second_active_s"),
                "reason": out.get("reason", ""),
                "ttft_p50_s": statistics.median(ttfts), "ttft_p95_s": ttfts[int(0.95 * (len(ttfts) - 1))],
                "ttft_max_s": ttfts[-1], "burst_s": time.monotonic() - t0, "requests": len(ttfts)}
    finally:
        rc.disconnect()
        lh.stop_local_head()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--load-s", type=float, default=20.0)
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--per-client", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=120)
    ap.add_argument("--out", type=Path, default=Path("out/live_standby.json"))
    ap.add_argument("--one-round", metavar="CONFIG", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one_round:  # a child process: Ray connects to one cluster per process
        print(json.dumps(one_round(args.one_round, args.clients, args.per_client, args.max_tokens)))
        return
    # A stray Ray call after disconnecting would auto-start a private local cluster, which
    # writes ~/.ray/auth_token and turns token auth on for every later `ray start` here.
    env = os.environ | {"RAY_ENABLE_AUTO_CONNECT": "0"}
    results: dict[str, list[dict]] = {"standby": [], "no-standby": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, standby in (("standby", 1), ("no-standby", 0)):  # interleaved: same noise
                cfg = Path(tmp) / f"{name}.yaml"
                cfg.write_text(_config(args.load_s, standby))
                child = subprocess.run(
                    [sys.executable, "-m", "hbmserve.ops.bench.live_standby", "--one-round", str(cfg),
                     "--clients", str(args.clients), "--per-client", str(args.per_client),
                     "--max-tokens", str(args.max_tokens)],
                    env=env, capture_output=True, text=True, timeout=900)
                if child.returncode != 0:
                    raise SystemExit(f"round {r + 1} {name} failed:\n{child.stderr[-3000:]}")
                res = json.loads(child.stdout.strip().splitlines()[-1])
                results[name].append(res)
                print(f"round {r + 1} {name}: scale-up decided after {res['scale_up_s']}s, second replica "
                      f"serving after {res['second_active_s']}s, "
                      f"TTFT p50 {res['ttft_p50_s']:.2f}s p95 {res['ttft_p95_s']:.2f}s max {res['ttft_max_s']:.2f}s",
                      flush=True)
    summary = {}
    for name, rounds in results.items():
        def med(key: str):
            vals = [x[key] for x in rounds if x[key] is not None]
            return statistics.median(vals) if vals else None
        summary[name] = {k: med(k) for k in ("scale_up_s", "second_active_s", "ttft_p50_s", "ttft_p95_s",
                                             "ttft_max_s")}

    def fmt(v, digits):
        return "never" if v is None else f"{v:.{digits}f}"

    print("\n| config | scale-up decided (s) | second replica serving (s) | TTFT p50 s | TTFT p95 s | TTFT max s |"
          "\n|---|---|---|---|---|---|")
    for name, s in summary.items():
        print(f"| {name} | {fmt(s['scale_up_s'], 1)} | {fmt(s['second_active_s'], 1)} | {fmt(s['ttft_p50_s'], 2)} | "
              f"{fmt(s['ttft_p95_s'], 2)} | {fmt(s['ttft_max_s'], 2)} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "rounds": results,
                                    "medians": summary}, indent=2))


if __name__ == "__main__":
    main()
