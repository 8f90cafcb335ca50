"""KV-aware routing live (issue 24, requirement 4): a real two-node Ray cluster with a front door on
each node, real Serve, simulated engines that publish their KV events, and clients spread over
both doors, as a load balancer in front of a cluster spreads them.

Each mode deploys the same model anew (4 replicas of a simulated Llama-3.1-8B on H100, 2 a node,
prefix caching on) and replays the same seeded chat trace (prefix_routing_live.trace: Zipf-popular
~2,000-character system prompts, sessions of a few turns whose prompts carry the whole
conversation); turn i of the trace goes to door i mod 2, so a conversation's turns land on both
doors. Modes:
- precise: `choose` on the KV index each door keeps from the engines' own events (the default);
- approximate: `choose` on what each door routed itself (`engine_settings.kv_events: false`);
- round robin, and Ray Serve's power of two (`serve.router`).
Reported per mode and round: prefix-cache hit rate (the replicas' own counters), TTFT p50/p95 at
the client, requests ok/sent; beside the trace's two bounds computed from the same hashes the
engines use (capacity/sim/prefix_bounds.py: one LRU of the fleet's cache, an infinite cache).

    python -m hbmserve.ops.bench.kv_routing_live --rounds 2 --out out/kv_routing_live.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Sequence

import numpy as np

from hbmserve.ops.bench.chaos import local_cluster, save
from hbmserve.ops.bench.prefix_routing_live import Turn, replay, trace

MODEL = "sim-kv"
MODES = {"precise": ("choose", True), "approximate": ("choose", False), "round robin": ("round-robin", True),
         "power of two": ("power-of-two", True)}
REPLICAS = 4


def spec(mode: str, port: int, speedup: float):
    from hbmserve.core.config import parse_cluster_spec

    router, events = MODES[mode]
    return parse_cluster_spec({
        "name": "hbmserve-kv-live",
        "serve": {"http": {"host": "127.0.0.1", "port": port, "max_connections_per_client": 4096}, "router": router},
        "models": [{"name": MODEL, "source": "sim", "engine": "sim", "replicas": REPLICAS, "max_replicas_per_node": 2,
                    "sim": {"gpu": "h100-sxm", "model_config_name": "llama-3.1-8b", "speedup": speedup},
                    "engine_settings": {"max_model_len": 8192, "max_num_seqs": 16, "enable_prefix_caching": True,
                                        "kv_events": events}}]})


def bounds(turns: Sequence[Turn], mode_spec) -> dict[str, float]:
    """The trace's bounds in the simulated engine's own hashes and token estimate."""
    from hbmserve.capacity.perf.hardware import load_catalog
    from hbmserve.capacity.perf.scenario import scenario_for
    from hbmserve.capacity.sim.prefix_bounds import prefix_bounds
    from hbmserve.capacity.traces.arrivals import Arrivals
    from hbmserve.deployments.replica.sim_protocol import BYTES_PER_TOKEN, estimate_tokens
    from hbmserve.routing.prefix import DEFAULT_BLOCK_CHARS, chat_prompt_text, prompt_block_hashes

    block = DEFAULT_BLOCK_CHARS // BYTES_PER_TOKEN  # one hash names 64 characters: 16 estimated tokens
    texts = [chat_prompt_text(list(t.messages)) for t in turns]
    hashes = [prompt_block_hashes(text) for text in texts]
    # The engine counts the prompt as rendered with the assistant's marker after it.
    prompt = np.asarray([estimate_tokens(text + "<|assistant|>\n") for text in texts], np.int64)
    arr = Arrivals(np.asarray([t.at_s for t in turns]), prompt, np.ones(len(turns), np.int64), tuple(hashes))
    eng = scenario_for(mode_spec.models[0], load_catalog()).engine
    per_replica = eng.num_blocks * eng.block_size // block
    b = prefix_bounds(arr, REPLICAS * per_replica, block)
    return {"bound_lru": b.lru_hit_rate, "bound_infinite": b.infinite_hit_rate}


def one_mode(mode: str, turns: Sequence[Turn], args) -> dict:
    from hbmserve.cluster import ray_cluster as rc

    rc.deploy(spec(mode, args.port, args.speedup))
    try:
        doors = sorted(d.own_url for d in rc.front_doors())
        time.sleep(2.0)  # the doors' first event streams and load polls
        ttfts = asyncio.run(replay(doors, turns, args.max_tokens, MODEL))
        time.sleep(1.0)
        (model,) = [m for m in rc.status() if m.name == MODEL]
        prompt = sum(r.prompt_tokens for r in model.replica_stats)
        hit = sum(r.prefix_hit_tokens for r in model.replica_stats)
    finally:
        rc.undeploy_all()
    ok = sorted(x for x in ttfts if x is not None)
    return {"mode": mode, "doors": len(doors), "sent": len(turns), "ok": len(ok),
            "ttft_p50_s": statistics.median(ok) if ok else None,
            "ttft_p95_s": ok[int(0.95 * (len(ok) - 1))] if ok else None,
            "prefix_hit_rate": hit / prompt if prompt else None}


def run(args) -> dict:
    runs = []
    with local_cluster(workers=1, num_cpus=1):
        for r in range(args.rounds):
            turns = trace(seed=r, duration_s=args.duration_s, sessions_per_s=args.sessions_per_s)
            b = bounds(turns, spec("precise", args.port, args.speedup))
            for mode in MODES:
                runs.append(one_mode(mode, turns, args) | b | {"round": r})
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    summary = {}
    for mode in MODES:
        mine = [x for x in runs if x["mode"] == mode]
        summary[mode] = {k: statistics.median(x[k] for x in mine if x[k] is not None)
                         for k in ("prefix_hit_rate", "bound_lru", "bound_infinite", "ttft_p50_s", "ttft_p95_s")}
        summary[mode] |= {"sent": sum(x["sent"] for x in mine), "ok": sum(x["ok"] for x in mine)}
    return {"runs": runs, "median": summary, "args": {k: v for k, v in vars(args).items() if k != "out"}}


def table(result: dict) -> str:
    lines = ["| router | prefix hit rate (of LRU bound) | LRU bound | infinite bound | TTFT p50 s | TTFT p95 s "
             "| ok/sent |", "|---|---|---|---|---|---|---|"]
    for mode, m in result["median"].items():
        lines.append(f"| {mode} | {m['prefix_hit_rate']:.1%} ({m['prefix_hit_rate'] / m['bound_lru']:.2f}x) "
                     f"| {m['bound_lru']:.1%} | {m['bound_infinite']:.1%} | {m['ttft_p50_s']:.3f} "
                     f"| {m['ttft_p95_s']:.3f} | {m['ok']}/{m['sent']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--duration-s", type=float, default=30.0, help="seconds of sessions starting, per round")
    p.add_argument("--sessions-per-s", type=float, default=1.5)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--speedup", type=float, default=2.0, help="the simulated engines' pace, x real time")
    p.add_argument("--port", type=int, default=18750)
    p.add_argument("--out", default=None, help="write the JSON here too")
    args = p.parse_args(argv)
    result = run(args)
    save(result, args.out)
    print(table(result))


if __name__ == "__main__":
    main()
