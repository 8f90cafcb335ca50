"""Adapter-aware routing against adapter-blind routing, with many LoRA adapters (issue 25,
requirement 6): in the simulator, and live on a real Ray Serve cluster with simulated engines.

Traffic: `adapters` fine-tunes of one base model, each request naming one with Zipf popularity
(capacity/traces/adapter_trace.py), Poisson arrivals. The fleet: 4 replicas of a simulated
Llama-3.1-8B on H100, each holding `max_cpu_loras` adapters registered and `max_loras` in its GPU
slots; a missing adapter costs a load (capacity/perf/lora.py). Routers (`serve.router`):
- adapter-aware: `choose`, the product (routing/choose.py);
- adapter-blind: `choose` as if no request named an adapter (`choose-adapter-blind`);
- power of two: Ray Serve's default, blind to adapters too.
Reported per router: TTFT p50/p95, adapter loads (per minute of trace), requests ok/sent.

    python -m hbmserve.ops.bench.lora_routing --sim --out out/lora_routing_sim.json
    python -m hbmserve.ops.bench.lora_routing --live --rounds 2 --out out/lora_routing_live.json

The simulator's figures are model predictions; the live run is a real cluster (two raylets on this
machine, a front door on each), real Serve, real HTTP streaming, with simulated engines whose step
times, loads and slots come from the same engine model.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

from hbmserve.capacity.traces.adapter_trace import AdapterTraceSpec, adapter_arrivals
from hbmserve.ops.bench.chaos import local_cluster, save

MODEL = "sim-lora"
ROUTERS = {"adapter-aware": "choose", "adapter-blind": "choose-adapter-blind", "power of two": "power-of-two"}
REPLICAS = 4


def sim_run(args) -> dict:
    from hbmserve.capacity.perf.engine_core import EngineConfig
    from hbmserve.capacity.perf.hardware import get_gpu
    from hbmserve.capacity.perf.lora import lora_cost
    from hbmserve.capacity.perf.model_shape import load_model_shape
    from hbmserve.capacity.perf.perf_model import Deployment, memory_fit
    from hbmserve.capacity.sim.cluster_sim import SimCluster, simulate
    from hbmserve.routing.routers import ROUTERS as BY_NAME

    dep = Deployment(load_model_shape("llama-3.1-8b"), get_gpu("h100-sxm"))
    eng = EngineConfig(num_blocks=memory_fit(dep).kv_tokens // 16, max_model_len=8192,
                       lora=lora_cost(dep, args.max_loras, args.max_cpu_loras, 16))
    runs = []
    for rate in args.rates:
        for seed in range(args.seeds):
            arr = adapter_arrivals(trace_spec(args, rate), seed)
            for name, router in ROUTERS.items():
                s = simulate(SimCluster(dep, eng, REPLICAS), arr, router=BY_NAME[router], stats_interval_s=0.1).summary
                runs.append({"router": name, "rate_rps": rate, "seed": seed, "ttft_p50_s": s.ttft.p50,
                             "ttft_p95_s": s.ttft.p95, "loads_per_min": s.adapter_loads / (args.duration_s / 60),
                             "ok": s.finished, "sent": s.requests})
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    return {"runs": runs, "median": summarize(runs, ("rate_rps",)), "args": _args(args)}


def trace_spec(args, rate: float) -> AdapterTraceSpec:
    return AdapterTraceSpec(adapters=args.adapters, zipf_s=args.zipf, rate_rps=rate, duration_s=args.duration_s,
                            prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
                            prefix=f"{MODEL}-lora-")


def spec(router: str, args):
    from hbmserve.core.config import parse_cluster_spec

    names = trace_spec(args, 1.0).names
    return parse_cluster_spec({
        "name": "hbmserve-lora-live",
        "serve": {"http": {"host": "127.0.0.1", "port": args.port, "max_connections_per_client": 4096},
                  "router": router},
        "models": [{"name": MODEL, "source": "sim", "engine": "sim", "replicas": REPLICAS, "max_replicas_per_node": 2,
                    "sim": {"gpu": "h100-sxm", "model_config_name": "llama-3.1-8b", "speedup": args.speedup},
                    "engine_settings": {"max_model_len": 8192, "max_num_seqs": 32},
                    "adapters": [{"name": n, "source": f"/adapters/{n}"} for n in names],
                    "lora": {"max_loras": args.max_loras, "max_cpu_loras": args.max_cpu_loras}}]})


async def replay(doors: list[str], arr, chars_per_token: int = 4) -> list[float | str]:
    """Each request at its time through door i mod len(doors), streamed: its TTFT, or why it
    failed (the status and error code, or the client's exception)."""
    import httpx

    async def one(client, i: int, t0: float) -> float | str:
        await asyncio.sleep(max(0.0, t0 + float(arr.t[i]) - time.monotonic()))
        body = {"model": arr.adapter_of(i) or MODEL, "prompt": "x " * (int(arr.prompt[i]) * chars_per_token // 2),
                "max_tokens": int(arr.output[i]), "stream": True}
        sent = time.monotonic()
        try:
            async with client.stream("POST", f"{doors[i % len(doors)]}/v1/completions", json=body) as r:
                if r.status_code != 200:
                    await r.aread()
                    return f"{r.status_code} {r.text[:200]}"
                first = None
                async for line in r.aiter_lines():
                    if first is None and line.startswith("data: "):
                        first = time.monotonic() - sent
                    if '"error"' in line:
                        return f"stream error {line[:200]}"
                return first if first is not None else "no data"
        except httpx.HTTPError as err:
            return f"{type(err).__name__} {err}"

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=512)) as client:
        t0 = time.monotonic() + 0.5
        return await asyncio.gather(*(one(client, i, t0) for i in range(len(arr))))


def adapter_loads() -> int:
    """Loads by every replica, from `status` (each door reports its node's replicas once)."""
    from hbmserve.cluster import ray_cluster as rc

    (model,) = [m for m in rc.status() if m.name == MODEL]
    return sum(a.loads for t in model.traffic for a in t.adapters)


def live_one(name: str, arr, args) -> dict:
    from hbmserve.cluster import ray_cluster as rc

    rc.deploy(spec(ROUTERS[name], args))
    try:
        doors = sorted(d.own_url for d in rc.front_doors())
        time.sleep(2.0)  # the doors' first load polls
        ttfts = asyncio.run(replay(doors, arr))
        time.sleep(1.0)
        loads = adapter_loads()
    finally:
        rc.undeploy_all()
    ok = sorted(x for x in ttfts if not isinstance(x, str))
    return {"router": name, "sent": len(arr), "ok": len(ok), "ttft_p50_s": statistics.median(ok) if ok else None,
            "ttft_p95_s": ok[int(0.95 * (len(ok) - 1))] if ok else None,
            "loads_per_min": loads / (args.duration_s / 60), "failed": [x for x in ttfts if isinstance(x, str)]}


def live_run(args) -> dict:
    runs = []
    with local_cluster(workers=1, num_cpus=1):
        for r in range(args.first_round, args.first_round + args.rounds):
            arr = adapter_arrivals(trace_spec(args, args.rates[0]), seed=r)
            for name in args.routers:
                runs.append(live_one(name, arr, args) | {"round": r, "rate_rps": args.rates[0]})
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    return {"runs": runs, "median": summarize(runs, ("rate_rps",)), "args": _args(args)}


def summarize(runs: list[dict], keys: tuple[str, ...]) -> list[dict]:
    out = []
    groups = sorted({(tuple(r[k] for k in keys), r["router"]) for r in runs}, key=lambda g: (g[0], list(ROUTERS).index(g[1])))
    for key, router in groups:
        mine = [r for r in runs if tuple(r[k] for k in keys) == key and r["router"] == router]
        row = dict(zip(keys, key)) | {"router": router}
        for k in ("ttft_p50_s", "ttft_p95_s", "loads_per_min"):
            vals = [r[k] for r in mine if r[k] is not None]
            row[k] = statistics.median(vals) if vals else None
        out.append(row | {"ok": sum(r["ok"] for r in mine), "sent": sum(r["sent"] for r in mine)})
    return out


def table(result: dict) -> str:
    lines = ["| rate req/s | router | TTFT p50 s | TTFT p95 s | adapter loads/min | ok/sent |", "|---|---|---|---|---|---|"]
    for m in result["median"]:
        lines.append(f"| {m['rate_rps']:g} | {m['router']} | {m['ttft_p50_s']:.3f} | {m['ttft_p95_s']:.3f} "
                     f"| {m['loads_per_min']:.0f} | {m['ok']}/{m['sent']} |")
    return "\n".join(lines)


def _args(args) -> dict:
    return {k: v for k, v in vars(args).items() if k != "out"}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--sim", action="store_true", help="the simulator: several rates and seeds, in seconds")
    where.add_argument("--live", action="store_true", help="a real Serve cluster with simulated engines")
    p.add_argument("--adapters", type=int, default=50)
    p.add_argument("--zipf", type=float, default=1.0)
    p.add_argument("--rates", type=float, nargs="+", default=None, help="requests/s (default: sim 10 20 30, live 8)")
    p.add_argument("--duration-s", type=float, default=None, help="default: sim 300, live 60")
    p.add_argument("--seeds", type=int, default=3, help="sim: seeds per rate")
    p.add_argument("--rounds", type=int, default=2, help="live: rounds, each a new seed")
    p.add_argument("--prompt-tokens", type=float, default=600.0)
    p.add_argument("--output-tokens", type=float, default=None, help="mean output tokens (default: sim 150, live 32)")
    p.add_argument("--max-loras", type=int, default=8)
    p.add_argument("--max-cpu-loras", type=int, default=16)
    p.add_argument("--speedup", type=float, default=1.0, help="live: the simulated engines' pace, x real time")
    p.add_argument("--routers", nargs="+", default=list(ROUTERS), choices=list(ROUTERS), help="live: which to run")
    p.add_argument("--first-round", type=int, default=0, help="live: the first round's seed")
    p.add_argument("--port", type=int, default=18770)
    p.add_argument("--out", default=None, help="write the JSON here too")
    args = p.parse_args(argv)
    live = args.live
    args.rates = args.rates or ([8.0] if live else [10.0, 20.0, 30.0])
    args.duration_s = args.duration_s or (60.0 if live else 300.0)
    args.output_tokens = args.output_tokens or (32.0 if live else 150.0)
    result = live_run(args) if live else sim_run(args)
    save(result, args.out)
    print(table(result))


if __name__ == "__main__":
    main()
