"""KV-aware routing against what each trace allows (issue 24, requirement 4), in the simulator.

The question a capacity planner asks: how much of a trace's reusable prompt does the cluster
actually reuse, and what does the router have to do with it? Each run replays one trace through
the same simulated cluster (Llama-3.1-8B on H100, TP=1, prefix caching on, vLLM's 16-token KV
blocks, the trace's hash blocks of `block_tokens`) with one of these routers:

- precise: `choose` on the KV index kept from the engines' own KV events (what the live door
  does when prefix caching is on, deployments/kv); every door sees every engine's cache;
- approximate: `choose` on what each door routed itself (routing/prefix.py), with `doors` front
  doors (one per node, clients spread over them), and with a single door;
- round robin, and Ray Serve's default power of two choices: blind to prefixes.

Beside the hit rate (prompt tokens found cached / prompt tokens) stand the trace's two bounds
(capacity/sim/prefix_bounds.py): one LRU cache as large as the fleet's caches together under
perfect affinity, and an infinite cache. Runs go over replica counts (how the hit rate grows
with the fleet) and host-tier sizes (engine_settings.kv_offload_gib, vLLM's --kv-offloading-size;
the LRU bound then counts the tier).

Traces, generated and seeded: capacity/traces/prefix_trace.py PREFIX_SHAPES (system-prompts,
multi-turn, agent-loops; `hbmserve prefix-trace` writes them as JSONL), plus any JSONL trace with
`hash_ids` (`--trace FILE`, e.g. Mooncake's conversation trace).

These are model predictions of the simulator, not measurements on hardware.

    python -m hbmserve.ops.bench.kv_routing --out out/kv_routing [--trace conv.jsonl] [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from hbmserve.capacity.perf.engine_core import EngineConfig
from hbmserve.capacity.perf.hardware import get_gpu
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment, memory_fit
from hbmserve.capacity.sim.cluster_sim import SimCluster, simulate
from hbmserve.capacity.sim.prefix_bounds import cluster_capacity_hashes, prefix_bounds
from hbmserve.capacity.traces.arrivals import Arrivals, read_trace
from hbmserve.capacity.traces.prefix_trace import BLOCK_TOKENS, PREFIX_SHAPES, PrefixTraceSpec, prefix_arrivals
from hbmserve.core.config import SloSeconds
from hbmserve.core.routing import PrefixSource
from hbmserve.routing.routers import ROUTERS

GIB = 1 << 30

TRACES: Mapping[str, PrefixTraceSpec] = PREFIX_SHAPES


@dataclass(frozen=True)
class Mode:
    router: str
    source: PrefixSource
    doors: int


def modes(doors: int) -> dict[str, Mode]:
    return {"precise": Mode("choose", PrefixSource.EVENTS, doors),
            f"approximate, {doors} doors": Mode("choose", PrefixSource.ROUTED, doors),
            "approximate, 1 door": Mode("choose", PrefixSource.ROUTED, 1),
            "round robin": Mode("round-robin", PrefixSource.ROUTED, doors),
            "power of two": Mode("power-of-two", PrefixSource.ROUTED, doors)}


@dataclass(frozen=True)
class BenchConfig:
    model: str = "llama-3.1-8b"
    gpu: str = "h100-sxm"
    max_model_len: int = 131072
    replicas: tuple[int, ...] = (4, 8, 16)
    host_gib: tuple[float, ...] = (0.0, 256.0)
    doors: int = 4
    seeds: tuple[int, ...] = (0, 1, 2)
    traces: tuple[str, ...] = tuple(TRACES)
    trace_files: tuple[str, ...] = ()
    duration_s: float | None = None  # shortens the generated traces (the dev loop)

    def spec(self, name: str) -> PrefixTraceSpec:
        s = TRACES[name]
        return s if self.duration_s is None else replace(s, duration_s=self.duration_s)


@dataclass
class Row:
    trace: str
    replicas: int
    host_gib: float
    mode: str
    runs: list[dict[str, float | None]] = field(default_factory=list)

    def median(self, key: str) -> float | None:
        vals = [r[key] for r in self.runs if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    def to_dict(self) -> dict[str, object]:
        keys = ("hit_rate", "bound_lru", "bound_infinite", "of_lru", "ttft_p50_s", "ttft_p95_s", "output_tok_s")
        return {"trace": self.trace, "replicas": self.replicas, "host_gib": self.host_gib, "mode": self.mode,
                **{k: self.median(k) for k in keys}, "runs": self.runs}


def engine(cfg: BenchConfig, dep: Deployment, host_gib: float) -> EngineConfig:
    per_tok = dep.model.kv_bytes_per_token_per_rank(dep.tp, dep.pp)
    return EngineConfig(num_blocks=memory_fit(dep).kv_tokens // 16, block_size=16, max_num_seqs=256,
                        max_num_batched_tokens=8192, max_model_len=cfg.max_model_len, enable_prefix_caching=True,
                        hash_block_tokens=BLOCK_TOKENS, host_kv_tokens=int(host_gib * GIB / per_tok))


def trace_makers(cfg: BenchConfig) -> dict[str, Callable[[int], Arrivals]]:
    out: dict[str, Callable[[int], Arrivals]] = {n: (lambda seed, s=cfg.spec(n): prefix_arrivals(s, seed))
                                                 for n in cfg.traces}
    for f in cfg.trace_files:  # a recorded trace has one seed: itself
        out[Path(f).name] = (lambda seed, f=f: read_trace(f))
    return out


def run(cfg: BenchConfig, progress: Callable[[str], None] = lambda _: None) -> list[Row]:
    dep = Deployment(load_model_shape(cfg.model), get_gpu(cfg.gpu), tp=1)
    rows: dict[tuple[str, int, float, str], Row] = {}
    for name, make in trace_makers(cfg).items():
        seeds = cfg.seeds if name in TRACES else cfg.seeds[:1]
        for seed in seeds:
            arrivals = make(seed)
            for host in cfg.host_gib:
                eng = engine(cfg, dep, host)
                for n in cfg.replicas:
                    bounds = prefix_bounds(arrivals, cluster_capacity_hashes(eng, n), BLOCK_TOKENS)
                    spec = SimCluster(dep, eng, n, SloSeconds(2.0, 0.1))
                    for label, m in modes(cfg.doors).items():
                        s = simulate(spec, arrivals, router=ROUTERS[m.router], prefix_source=m.source,
                                     doors=m.doors).summary
                        hit = s.prefix_hit_rate or 0.0
                        rows.setdefault((name, n, host, label), Row(name, n, host, label)).runs.append({
                            "seed": seed, "requests": s.requests, "hit_rate": hit,
                            "bound_lru": bounds.lru_hit_rate, "bound_infinite": bounds.infinite_hit_rate,
                            "of_lru": hit / bounds.lru_hit_rate if bounds.lru_hit_rate else None,
                            "ttft_p50_s": s.ttft.p50, "ttft_p95_s": s.ttft.p95, "output_tok_s": s.output_tok_s})
                    progress(f"{name} seed {seed} host {host:g} GiB {n} replicas")
    return list(rows.values())


def _f(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(rows: Sequence[Row]) -> str:
    lines = ["| trace | replicas | host tier GiB | router | hit rate | of LRU bound | LRU bound | infinite bound "
             "| TTFT p50 (s) | TTFT p95 (s) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.trace} | {r.replicas} | {r.host_gib:g} | {r.mode} | {_f(r.median('hit_rate'), '.1%')} "
                     f"| {_f(r.median('of_lru'), '.2f')}x | {_f(r.median('bound_lru'), '.1%')} "
                     f"| {_f(r.median('bound_infinite'), '.1%')} | {_f(r.median('ttft_p50_s'), '.3f')} "
                     f"| {_f(r.median('ttft_p95_s'), '.3f')} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("out/kv_routing"), help="folder for JSON and markdown")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds of the generated traces")
    parser.add_argument("--replicas", default="4,8,16", help="comma-separated replica counts")
    parser.add_argument("--host-gib", default="0,256", help="comma-separated host KV tier sizes per replica, GiB")
    parser.add_argument("--doors", type=int, default=4, help="front doors for the approximate router")
    parser.add_argument("--traces", default=",".join(TRACES), help="generated traces to run (comma-separated; "
                        "empty for none)")
    parser.add_argument("--trace", action="append", default=[], help="a JSONL trace with hash_ids (repeatable)")
    parser.add_argument("--duration-s", type=float, default=None, help="shorten the generated traces (dev loop)")
    args = parser.parse_args(argv)
    names = tuple(n for n in args.traces.split(",") if n)
    unknown = [n for n in names if n not in TRACES]
    if unknown:
        parser.error(f"unknown trace {unknown[0]!r}; known: {', '.join(TRACES)}")
    cfg = BenchConfig(replicas=tuple(int(x) for x in args.replicas.split(",")),
                      host_gib=tuple(float(x) for x in args.host_gib.split(",")), doors=args.doors,
                      seeds=tuple(int(x) for x in args.seeds.split(",")), traces=names, trace_files=tuple(args.trace),
                      duration_s=args.duration_s)
    start = time.perf_counter()
    rows = run(cfg, progress=lambda msg: print(f"[{time.perf_counter() - start:6.0f} s] {msg}", flush=True))
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "kv_routing", "config": asdict(cfg), "wall_s": round(time.perf_counter() - start, 1),
           "traces": {n: asdict(cfg.spec(n)) for n in names},
           "note": "simulator predictions; medians over seeds of the generated traces", "rows": [r.to_dict() for r in rows]}
    (args.out / "kv_routing.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    (args.out / "kv_routing.md").write_text(table(rows) + "\n")
    print(table(rows))
    print(f"wrote {args.out / 'kv_routing.json'} and {args.out / 'kv_routing.md'}")


if __name__ == "__main__":
    main()
