"""Prefix-aware routing (issue 10): `choose` against round robin and Ray Serve's default
power-of-two router in the simulator, on a prefix-heavy trace.

Cluster: 4 replicas of Llama-3.1-8B on one simulated A100-80G each (TP=1, KV blocks from the
memory model, vLLM's defaults: 16-token blocks, 256 sequences, 8192 batched tokens, chunked
prefill, prefix caching on). Traces, one per seed:
  - prefix-heavy (capacity/traces/prefix_trace.py): 8 system prompts (~2,500 tokens, Zipf), chat
    sessions of ~4 turns 30 s apart, 6 new sessions a second (about 20 requests a second,
    ~3,400-token prompts of which ~90% can come from a cache);
  - no shared prefix (control): Poisson, 10 requests a second, 3,000-token prompts with no
    block hashes, so only load balancing counts; this is where the power-of-two fallback acts.
Each router runs with the replicas' stats as of now and as of up to `stats_interval_s` ago (the
live ingress polls replica stats about every 100 ms). `least-loaded` is an ablation, not a
baseline: the deterministic pick that stale stats herd.

Reported per (trace, stats age, router), median over seeds: TTFT p50 and p95, prefix-cache hit
rate (prompt tokens read from cache / prompt tokens), output tokens per second. These are model
predictions of the simulator, not measurements on hardware.

    python -m hbmserve.ops.bench.prefix_routing --out out/prefix_routing [--seeds 0,1,2,3,4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hbmserve.capacity.traces.arrivals import Arrivals, gamma_arrivals
from hbmserve.capacity.perf.engine_core import EngineConfig
from hbmserve.capacity.perf.hardware import get_gpu
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment, memory_fit
from hbmserve.capacity.traces.prefix_trace import PrefixTraceSpec, prefix_arrivals
from hbmserve.routing.routers import ROUTERS
from hbmserve.capacity.sim.cluster_sim import SimCluster, simulate
from hbmserve.core.config import SloSeconds

METRICS = ("ttft_p50_s", "ttft_p95_s", "prefix_hit_rate", "output_tok_s")


@dataclass(frozen=True)
class BenchConfig:
    model: str = "llama-3.1-8b"
    gpu: str = "a100-80g-sxm"
    replicas: int = 4
    max_model_len: int = 8192
    prefix: PrefixTraceSpec = PrefixTraceSpec(session_rps=6.0)
    control_rps: float = 10.0  # the no-shared-prefix trace
    control_prompt_tokens: float = 3000.0
    control_output_tokens: float = 250.0
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    stats_intervals_s: tuple[float, ...] = (0.0, 0.1)
    routers: tuple[str, ...] = ("choose", "round-robin", "power-of-two", "least-loaded")


def cluster(cfg: BenchConfig) -> SimCluster:
    dep = Deployment(load_model_shape(cfg.model), get_gpu(cfg.gpu), tp=1)
    eng = EngineConfig(num_blocks=memory_fit(dep).kv_tokens // 16, block_size=16, max_num_seqs=256,
                       max_num_batched_tokens=8192, max_model_len=cfg.max_model_len,
                       enable_prefix_caching=True, hash_block_tokens=cfg.prefix.block_tokens)
    return SimCluster(dep, eng, cfg.replicas, SloSeconds(2.0, 0.1))


def traces(cfg: BenchConfig) -> Mapping[str, Callable[[int], Arrivals]]:
    return {
        "prefix-heavy": lambda seed: prefix_arrivals(cfg.prefix, seed),
        "no shared prefix": lambda seed: gamma_arrivals(
            cfg.control_rps, cfg.prefix.duration_s, 1.0, cfg.control_prompt_tokens, cfg.control_output_tokens,
            length_cv=0.8, seed=seed).clipped(cfg.max_model_len),
    }


@dataclass
class Row:
    trace: str
    stats_interval_s: float
    router: str
    runs: list[dict[str, float | None]] = field(default_factory=list)

    def median(self, key: str) -> float | None:
        vals = [r[key] for r in self.runs if r[key] is not None]
        return statistics.median(vals) if vals else None

    def to_dict(self) -> dict[str, object]:
        return {**{k: v for k, v in asdict(self).items() if k != "runs"},
                **{k: self.median(k) for k in METRICS}, "runs": self.runs}


def run(cfg: BenchConfig) -> list[Row]:
    spec = cluster(cfg)
    rows: dict[tuple[str, float, str], Row] = {}
    for name, make in traces(cfg).items():
        for seed in cfg.seeds:
            arrivals = make(seed)
            for age in cfg.stats_intervals_s:
                for router in cfg.routers:
                    s = simulate(spec, arrivals, router=ROUTERS[router], stats_interval_s=age).summary
                    row = rows.setdefault((name, age, router), Row(name, age, router))
                    row.runs.append({"seed": seed, "requests": s.requests, "finished": s.finished,
                                     "ttft_p50_s": s.ttft.p50, "ttft_p95_s": s.ttft.p95,
                                     "prefix_hit_rate": s.prefix_hit_rate, "output_tok_s": s.output_tok_s})
    return list(rows.values())


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(rows: Sequence[Row]) -> str:
    lines = ["| trace | stats age | router | TTFT p50 (s) | TTFT p95 (s) | prefix-cache hit rate | output tok/s |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        age = "fresh" if r.stats_interval_s == 0 else f"<= {r.stats_interval_s:g} s"
        lines.append(f"| {r.trace} | {age} | {r.router} | {_fmt(r.median('ttft_p50_s'), '.3f')} "
                     f"| {_fmt(r.median('ttft_p95_s'), '.3f')} | {_fmt(r.median('prefix_hit_rate'), '.1%')} "
                     f"| {_fmt(r.median('output_tok_s'), '.0f')} |")
    return "\n".join(lines)


def write(rows: Sequence[Row], cfg: BenchConfig, out: Path, wall_s: float) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "prefix_routing", "config": asdict(cfg), "wall_s": round(wall_s, 1),
           "note": "simulator predictions; medians over seeds", "rows": [r.to_dict() for r in rows]}
    js, md = out / "prefix_routing.json", out / "prefix_routing.md"
    js.write_text(json.dumps(doc, indent=2) + "\n")
    md.write_text(table(rows) + "\n")
    return js, md


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/prefix_routing"), help="folder for JSON and markdown")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated trace seeds (medians over them)")
    parser.add_argument("--stats-intervals", default="0,0.1", help="router stats ages to run, seconds")
    args = parser.parse_args(argv)
    cfg = BenchConfig(seeds=tuple(int(s) for s in args.seeds.split(",")),
                      stats_intervals_s=tuple(float(s) for s in args.stats_intervals.split(",")))
    start = time.perf_counter()
    rows = run(cfg)
    wall = time.perf_counter() - start
    print(table(rows))
    for path in write(rows, cfg, args.out, wall):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
