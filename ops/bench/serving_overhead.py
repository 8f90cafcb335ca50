"""hbmserve's serving path vs bare vLLM, side by side, with vLLM's own serving benchmark.

Each round starts bare `vllm.entrypoints.openai.api_server` and then hbmserve (local Ray head,
Serve deployment) on the same tiny model and engine settings, one at a time (2 cores: never
both at once), and runs `vllm.benchmarks.serve` at each concurrency. Reports medians over
rounds and the ratios hbmserve / bare.

    python -m hbmserve.ops.bench.serving_overhead --rounds 3 --out out/serving_overhead.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from hbmserve.core.config import load_cluster_spec
from hbmserve.deployments.engine_args import vllm_launch
from hbmserve.deployments.vllm_argv import launch_argv, serve_parser

METRICS = ("output_throughput", "median_ttft_ms", "median_tpot_ms")
P95_METRICS = ("p95_ttft_ms", "p95_tpot_ms")
BARE_PORT = 8100


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


def bench_bare(model, concurrencies, prompts, extra_env: dict[str, str]) -> dict[int, dict]:
    with bare_vllm(model, extra_env) as url:
        return {c: run_vllm_bench(url, model.name, model.source, c, prompts) for c in concurrencies}


def bench_hbmserve(config: str | None, model, concurrencies, prompts) -> tuple[dict[int, dict], float]:
    hb = [sys.executable, "-m", "hbmserve"]
    t0 = time.monotonic()
    try:
        subprocess.run([*hb, "up", "--detach", *([config] if config else [])], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        startup = time.monotonic() - t0
        url = "http://127.0.0.1:8000"
        wait_ready(url, 60)
        return {c: run_vllm_bench(url, model.name, model.source, c, prompts) for c in concurrencies}, startup
    finally:
        subprocess.run([*hb, "down"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None, help="cluster YAML (default: the embedded tiny model)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    p.add_argument("--out", default="out/serving_overhead.json")
    p.add_argument("--bare-env", nargs="*", default=[], metavar="KEY=VALUE",
                   help="extra environment for the bare server, e.g. OMP_NUM_THREADS=1")
    a = p.parse_args()
    bare_env = dict(kv.split("=", 1) for kv in a.bare_env)
    model = load_cluster_spec(a.config).models[0]
    rounds = []
    for r in range(a.rounds):
        bare = bench_bare(model, a.concurrency, a.prompts, bare_env)
        ours, startup = bench_hbmserve(a.config, model, a.concurrency, a.prompts)
        rounds.append({"bare": bare, "hbmserve": ours, "hbmserve_up_s": startup})
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    summary = {}
    for c in a.concurrency:
        row = {}
        for side in ("bare", "hbmserve"):
            for k in METRICS:
                row[f"{side}_{k}"] = statistics.median(rd[side][c][k] for rd in rounds)
        row["throughput_ratio"] = row["hbmserve_output_throughput"] / row["bare_output_throughput"]
        row["ttft_p50_ratio"] = row["hbmserve_median_ttft_ms"] / row["bare_median_ttft_ms"]
        row["tpot_p50_ratio"] = row["hbmserve_median_tpot_ms"] / row["bare_median_tpot_ms"]
        row["throughput_ratio_per_round"] = [rd["hbmserve"][c]["output_throughput"] / rd["bare"][c]["output_throughput"]
                                             for rd in rounds]
        summary[c] = row
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"rounds": rounds, "median": summary, "bare_env": bare_env}, indent=2))
    print("| concurrency | side | output tok/s | TTFT p50 ms | TPOT p50 ms |")
    print("|---|---|---|---|---|")
    for c, row in summary.items():
        for side in ("bare", "hbmserve"):
            print(f"| {c} | {side} | {row[side + '_output_throughput']:.0f} | {row[side + '_median_ttft_ms']:.1f} "
                  f"| {row[side + '_median_tpot_ms']:.1f} |")
        print(f"| {c} | ratio | {row['throughput_ratio']:.2f}x | {row['ttft_p50_ratio']:.2f}x "
              f"| {row['tpot_p50_ratio']:.2f}x |")
        per_round = ", ".join(f"{x:.2f}" for x in row["throughput_ratio_per_round"])
        print(f"| {c} | throughput ratio per round | {per_round} | | |")


if __name__ == "__main__":
    main()
