"""A model's config changed under load: it rolls replica by replica inside the fleet's GPUs, and a
broken version rolls back; what the clients saw throughout.

A real Ray cluster on this machine (ray.cluster_utils.Cluster, one node holding exactly the
fleet's GPUs as Ray resources, `--replicas` of them), real Serve, the front door, simulated
engines that reserve one GPU each (Llama-3.1-8B on H100, `--speedup` times real time).
`--clients` closed-loop clients stream completions of `--tokens` tokens through the front door
(each reply checked whole, as ops/bench/chaos.py does) while:

1. the model's section changes (`sim.speedup`, as a new engine build would change its speed)
   and `hbmserve deploy`'s rolling path (cluster/rolling_deploy.py) carries it through;
2. after a pause, a broken version (its weights source does not exist) is deployed: its replica
   never serves and the model rolls back to the version before.

With `--autoscaled` the model is autoscaled (held at `--replicas`), so Serve updates it in
place and the old version is handed back when the new one fails.

Every 0.2 s a sampler counts the model's replicas in Serve (both versions, stopping ones
included) and the GPUs Ray has handed out. Reported: sent / completed / failed, each rollout's
steps on one timeline (seconds since the load began) with the replicas held and the requests
completed per second around them, and the most replicas and GPUs ever held.

    python -m hbmserve.ops.bench.rollout_under_load --out out/rollout.json
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time

import httpx

from hbmserve.ops.bench.chaos import Tally, local_cluster, save, stream_client

MODEL = "sim-roll"


def spec(speedup: float, port: int, replicas: int, broken: bool = False, ready_timeout_s: float = 60.0,
         autoscaled: bool = False):
    from hbmserve.core.config import parse_cluster_spec

    sim = {"gpu": "h100-sxm", "model_config_name": "llama-3.1-8b", "speedup": speedup, "reserve_gpus": True,
           **({"cache_weights": True} if broken else {})}
    return parse_cluster_spec({
        "name": "hbmserve-rollout",
        "serve": {"http": {"host": "127.0.0.1", "port": port, "max_connections_per_client": 4096},
                  "rollout": {"ready_timeout_s": ready_timeout_s}},
        "models": [{"name": MODEL, "source": "/nonexistent/weights" if broken else "sim", "engine": "sim",
                    "sim": sim, "engine_settings": {"max_model_len": 4096, "max_num_seqs": 8},
                    # Autoscaled, held at the fleet's size: Serve updates it in place.
                    **({"autoscaling": {"min_replicas": replicas, "max_replicas": replicas}} if autoscaled
                       else {"replicas": replicas})}]})


class Sampler(threading.Thread):
    """Every 0.2 s: seconds since the load began, the model's live replica actors (both versions,
    stopping ones included), the GPUs Ray has handed out, and the streams completed."""

    def __init__(self, t0: float, tally: Tally):
        super().__init__(daemon=True)
        self.t0, self.tally, self.stop, self.samples = t0, tally, threading.Event(), []

    def run(self) -> None:
        import ray

        from hbmserve.deployments.wire.names import engine_deployment_name

        # Ray's named actors, not Serve's status: building Serve's status objects in a second
        # thread races the rollout's own deployment builds (Serve's config module is not thread-safe).
        part = f"#{engine_deployment_name(MODEL)}#"  # a replica actor is named ...APP#DEPLOYMENT#ID
        while not self.stop.wait(0.2):
            try:
                held = sum(1 for a in ray.util.list_named_actors(all_namespaces=True) if part in a["name"])
                gpus = ray.cluster_resources().get("GPU", 0) - ray.available_resources().get("GPU", 0)
            except Exception:  # noqa: BLE001 - a status hiccup skips one sample
                continue
            self.samples.append((round(time.monotonic() - self.t0, 1), held, gpus, self.tally.completed))


async def _load(url: str, args, stop: asyncio.Event, tally: Tally) -> None:
    limits = httpx.Limits(max_connections=args.clients * 2)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        while not stop.is_set():  # rounds of streams, so that stopping waits for whole replies only
            await asyncio.gather(*(stream_client(http, url, args.tokens, time.monotonic() + 1.0, tally, MODEL)
                                   for _ in range(args.clients)))


def _timeline(record, t0_wall: float) -> list[dict]:
    return [{"at_s": round(s.at - t0_wall, 1), "old": s.old_replicas, "new": s.new_replicas, "reason": s.reason}
            for s in record.steps]


def run(args) -> dict:
    from hbmserve.cluster import ray_cluster as rc
    from hbmserve.cluster.rolling_deploy import update
    from hbmserve.deployments.wire.records_store import latest_deployed

    with local_cluster(num_cpus=2, num_gpus=args.replicas):
        print(f"deploying {args.replicas} simulated replicas, one GPU each, on {args.replicas} GPUs ...",
              file=sys.stderr)
        url = rc.deploy(spec(args.speedup, args.port, args.replicas, autoscaled=args.autoscaled))[MODEL]
        tally, stop = Tally(), asyncio.Event()
        t0, t0_wall = time.monotonic(), time.time()
        sampler = Sampler(t0, tally)
        sampler.start()

        async def drive() -> list:
            load = asyncio.ensure_future(_load(url, args, stop, tally))
            await asyncio.sleep(args.warmup_s)
            rollouts = []
            for broken in (False, True):
                new = spec(args.speedup * 1.5, args.port, args.replicas, broken=broken,
                           ready_timeout_s=args.ready_timeout_s, autoscaled=args.autoscaled)
                done = await asyncio.to_thread(update, new, lambda r: print(f"  {r.reason}", file=sys.stderr))
                assert not isinstance(done, str), done
                rollouts += done.rollouts
                await asyncio.sleep(args.pause_s)
            stop.set()
            await load
            return rollouts

        try:
            rollouts = asyncio.run(drive())
        finally:  # before Ray goes: a status call after it would start a Ray of its own
            sampler.stop.set()
            sampler.join()
        after = {"deployed_apps": latest_deployed().apps, "last_rollouts": {r.model: r.phase for r in rc.rollouts()}}
        counts = {k: sum(getattr(t, k) for d in rc.front_doors() for t in d.models if t.model == MODEL)
                  for k in ("migrated", "retried")}
    return {
        "sent": tally.sent, "completed": tally.completed, "failed": tally.failed, "failures": tally.failures,
        **counts, **after, "fleet_gpus": args.replicas,
        "most_replicas_held": max((s[1] for s in sampler.samples), default=0),
        "most_gpus_held": max((s[2] for s in sampler.samples), default=0),
        "rollouts": [{"phase": r.phase, "from": r.from_app, "to": r.to_app, "seconds": round(r.at - r.started_at, 1),
                      "max_in_use": r.max_in_use, "steps": _timeline(r, t0_wall)} for r in rollouts],
        "samples": sampler.samples,
        "args": {k: v for k, v in vars(args).items() if k != "out"}}


def main_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=3, help="the fleet: replicas, and GPUs of the one node")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--speedup", type=float, default=4.0)
    p.add_argument("--warmup-s", type=float, default=5.0)
    p.add_argument("--pause-s", type=float, default=5.0, help="load between and after the two deploys")
    p.add_argument("--ready-timeout-s", type=float, default=30.0, help="serve.rollout.ready_timeout_s")
    p.add_argument("--autoscaled", action="store_true",
                   help="an autoscaled model (held at --replicas), which Serve updates in place")
    p.add_argument("--port", type=int, default=18780)
    p.add_argument("--out", default=None, help="write the JSON result here too")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = main_args(argv)
    save(run(args), args.out)


if __name__ == "__main__":
    main()
