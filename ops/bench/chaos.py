"""Chaos under steady load: replicas killed every few seconds and one node removed, while
clients stream; what was sent, completed, moved to another replica (mid-stream migration) and
failed, and what the break cost the client.

A real multi-node Ray cluster on this machine (ray.cluster_utils.Cluster: a head and two worker
raylets), real Serve, the front door, simulated engines (4 replicas of Llama-3.1-8B on H100,
`--speedup` times real time). `--clients` closed-loop clients each stream completions of
`--tokens` tokens, one after another, through the head node's front door. After a warm-up, a
random replica's actor is killed every `--kill-every-s` seconds (Serve starts a new one), and
half-way through a worker node is removed with its replicas. Then the load stops.

Per request, the client checks the whole text (the simulated engine's words are known, so a
token lost or sent twice shows) and the [DONE]. The migration latency is the client's longest
gap between two events of a stream that moved (the door counts the streams that moved; theirs
are the longest gaps), beside the longest gap of the streams that did not and the typical gap
(TPOT). "Failed" counts replies that were not whole: an error event, a short text, an HTTP error.

    python -m hbmserve.ops.bench.chaos --duration-s 120 --out out/chaos.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from hbmserve.deployments.replica.sim_protocol import filler_text

MODEL = "sim-chaos"


@dataclass
class Tally:
    sent: int = 0
    completed: int = 0
    failed: int = 0
    failures: list[str] = field(default_factory=list)  # the first few, for the report
    worst_gap_s: list[float] = field(default_factory=list)  # per completed stream
    typical_gap_s: list[float] = field(default_factory=list)  # per completed stream: its median gap


def spec(speedup: float, port: int):
    from hbmserve.core.config import parse_cluster_spec

    return parse_cluster_spec({
        "name": "hbmserve-chaos",
        "serve": {"http": {"host": "127.0.0.1", "port": port, "max_connections_per_client": 4096}},
        "models": [{"name": MODEL, "source": "sim", "engine": "sim", "replicas": 4, "max_replicas_per_node": 2,
                    "sim": {"gpu": "h100-sxm", "model_config_name": "llama-3.1-8b", "speedup": speedup},
                    "engine_settings": {"max_model_len": 4096, "max_num_seqs": 8}}]})


async def stream_client(http: httpx.AsyncClient, url: str, tokens: int, stop_at: float, tally: Tally,
                        model: str = MODEL) -> None:
    """Streams completions one after another until `stop_at`, checking each whole (the simulated
    engine's words are known) into `tally`."""
    want = filler_text(tokens)
    body = {"model": model, "prompt": "chaos", "max_tokens": tokens, "stream": True}
    while time.monotonic() < stop_at:
        tally.sent += 1
        text, done, gaps, last, error = "", False, [], None, None
        try:
            async with http.stream("POST", f"{url}/v1/completions", json=body) as r:
                if r.status_code != 200:
                    error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                else:
                    async for line in r.aiter_lines():
                        if not line:
                            continue
                        now = time.monotonic()
                        if last is not None:
                            gaps.append(now - last)
                        last = now
                        if line == "data: [DONE]":
                            done = True
                        elif line.startswith("data: "):
                            event = json.loads(line[6:])
                            if "error" in event:
                                error = event["error"]["message"]
                            text += "".join(c.get("text", "") for c in event.get("choices", ()))
        except httpx.HTTPError as err:
            error = f"{type(err).__name__}: {err}"
        if error is None and (not done or text != want):
            error = f"incomplete: {len(text)} of {len(want)} characters, [DONE] {done}"
        if error is None:
            tally.completed += 1
            tally.worst_gap_s.append(max(gaps, default=0.0))
            tally.typical_gap_s.append(statistics.median(gaps) if gaps else 0.0)
        else:
            tally.failed += 1
            if len(tally.failures) < 5:
                tally.failures.append(error)


def _replica_actors() -> list[str]:
    import ray

    from hbmserve.deployments.wire.names import engine_deployment_name

    part = f"#{engine_deployment_name(MODEL)}#"  # Serve names a replica's actor ...APP#DEPLOYMENT#ID
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if part in a["name"]]


async def _chaos(c, workers, warmup_s: float, duration_s: float, kill_every_s: float, seed: int) -> list[dict]:
    import ray

    rng, events, t0 = random.Random(seed), [], time.monotonic()
    await asyncio.sleep(warmup_s)
    node_removed = False
    while (elapsed := time.monotonic() - t0) < warmup_s + duration_s:
        if not node_removed and elapsed >= warmup_s + duration_s / 2:
            victim = workers[rng.randrange(len(workers))]
            await asyncio.to_thread(c.remove_node, victim)
            events.append({"at_s": round(elapsed, 1), "removed_node": victim.node_id[:8]})
            node_removed = True
        else:
            names = await asyncio.to_thread(_replica_actors)
            if names:
                name = rng.choice(names)
                await asyncio.to_thread(lambda: ray.kill(ray.get_actor(name, namespace="serve"), no_restart=False))
                events.append({"at_s": round(elapsed, 1), "killed": name.rsplit("#", 1)[1]})
        await asyncio.sleep(kill_every_s)
    return events


def _door_counts(rc) -> dict[str, int]:
    traffic = [t for d in rc.front_doors() for t in d.models if t.model == MODEL]
    return {k: sum(getattr(t, k) for t in traffic) for k in ("migrated", "migration_failed", "retried")}


async def _load_and_chaos(c, workers, url: str, args) -> tuple[Tally, list[dict]]:
    tally = Tally()
    stop_at = time.monotonic() + args.warmup_s + args.duration_s
    limits = httpx.Limits(max_connections=args.clients * 2)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        clients = [asyncio.ensure_future(stream_client(http, url, args.tokens, stop_at, tally)) for _ in range(args.clients)]
        events = await _chaos(c, workers, args.warmup_s, args.duration_s, args.kill_every_s, args.seed)
        await asyncio.gather(*clients)
    return tally, events


@contextlib.contextmanager
def local_cluster(workers: int = 0, **head_args):
    """A Ray cluster on this machine (a head and `workers` one-CPU raylets), this process
    connected; Serve, the connection and the raylets stopped after, whatever happened."""
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from hbmserve.cluster import ray_cluster as rc

    c = Cluster(initialize_head=True, head_node_args={"include_dashboard": False, **head_args})
    try:
        nodes = [c.add_node(num_cpus=1) for _ in range(workers)]
        c.wait_for_nodes(timeout=60)
        rc.connect(c.address)
        yield c, nodes
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            c.shutdown()


def save(result: dict, out: str | None) -> None:
    """Print the result as JSON, and write it to `out` too when given."""
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")


def run(args) -> dict:
    from hbmserve.cluster import ray_cluster as rc

    with local_cluster(workers=2, num_cpus=1) as (c, workers):
        print("deploying 4 simulated replicas over 3 nodes ...", file=sys.stderr)
        rc.deploy(spec(args.speedup, args.port))
        head_door = next(d for d in rc.front_doors() if d.node_id == c.head_node.node_id)
        print(f"load: {args.clients} clients; chaos for {args.duration_s:g} s after {args.warmup_s:g} s",
              file=sys.stderr)
        tally, events = asyncio.run(_load_and_chaos(c, workers, head_door.own_url, args))
        counts = _door_counts(rc)
    # The streams that moved are the ones with the longest gap: the door counts them, and the
    # client's longest gaps, that many, are their breaks (the rest is ordinary jitter).
    worst = sorted(tally.worst_gap_s)
    moved, calm = worst[len(worst) - counts["migrated"]:] if counts["migrated"] else [], worst[:len(worst) - counts["migrated"]]
    result = {"sent": tally.sent, "completed": tally.completed, "failed": tally.failed, **counts,
              "kills": sum("killed" in e for e in events), "nodes_removed": sum("removed_node" in e for e in events),
              "events": events, "failures": tally.failures,
              "tpot_p50_ms": round(1000 * statistics.median(tally.typical_gap_s), 2) if tally.typical_gap_s else None,
              "break_gap_ms": {"streams": len(moved),
                               "p50": round(1000 * statistics.median(moved), 1) if moved else None,
                               "max": round(1000 * moved[-1], 1) if moved else None},
              "longest_gap_ms_of_streams_not_moved": {
                  "p50": round(1000 * statistics.median(calm), 1) if calm else None,
                  "max": round(1000 * calm[-1], 1) if calm else None},
              "args": {k: v for k, v in vars(args).items() if k != "out"}}
    return result


def main_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration-s", type=float, default=120.0, help="chaos lasts this long (after the warm-up)")
    p.add_argument("--warmup-s", type=float, default=5.0)
    p.add_argument("--kill-every-s", type=float, default=5.0)
    p.add_argument("--clients", type=int, default=12)
    p.add_argument("--tokens", type=int, default=400)
    p.add_argument("--speedup", type=float, default=4.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, default=18750)
    p.add_argument("--out", default=None, help="write the JSON result here too")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = main_args(argv)
    save(run(args), args.out)


if __name__ == "__main__":
    main()
