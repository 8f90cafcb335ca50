"""What the front door costs per streamed token, in CPU, without vLLM or Ray: the development
loop for the data path (issue 22), seconds a round instead of minutes.

Three processes on loopback: a simulated replica (deployments/replica/sim_server.py, its engine
paced by `speedup`), the front door's app and listener in front of it (ops/sim_door.py, the
same FrontDoorApp, relay and HardenedServer the Serve deployment runs), and a client streaming
`--concurrency` completions of `--tokens` tokens each. Sides, interleaved per round:
* `direct`: the client streams from the replica's private port;
* `door`: the same through the front door;
* `haproxy` (asked for with `--sides`): the same through Ray's bundled HAProxy in HTTP mode with
  `option http-no-delay`, a compiled relay that decides nothing: what carrying the bytes costs
  when no Python touches a chunk;
* `inproc` (asked for with `--sides`): a replica and a door in one process, the door calling the
  replica's ASGI app with no socket between them (ops/bench/inproc_door.py): what the hop costs;
* `pyrelay` (asked for with `--sides`): a Python HTTP relay that decides and reads nothing
  (ops/bench/pyrelay.py), on the door's loop: the floor under any door written in Python;
* `asgirelay` (asked for with `--sides`): the door's listener and relay deciding nothing
  (pyrelay.asgi_relay): what the door's layers cost without its features.
Per side and round: tokens/s, and CPU-ms per 1,000 streamed tokens of the door, the replica
process, HAProxy and the in-process pair, read from /proc (each thread's scheduler run time) over the run. The door's figure is what a token costs
the data path; the replica's is the upper bound of what the door could save by being absent.

    python -m hbmserve.ops.bench.door_cpu --rounds 3 --concurrency 16 --tokens 256 --requests 64

`HBMSERVE_BENCH_LOOP=uvloop` runs the door (and the in-process pair) on uvloop instead of asyncio's loop (measured: no
difference, docs/benchmarks.md). `HBMSERVE_BENCH_MIGRATION_LIMIT=0` turns mid-stream migration
off (the door then relays chunks without reading them for token ids). `HBMSERVE_BENCH_PUSH=0`
relays every chunk through ASGI `send` instead of the listener's push (wire/chunk_push.py), as
the door did before the push: the A/B of that change.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hbmserve.deployments.wire.http import INTERNAL_TOKEN_HEADER
from hbmserve.ops.bench.cpu_split import cpu_s

MODEL = {"name": "sim", "source": "simulated", "engine": "sim", "replicas": 1,
         "sim": {"gpu": "h100-sxm", "model_config_name": "llama-3.1-8b", "speedup": 4.0},
         "engine_settings": {"max_model_len": 4096, "max_num_seqs": 64}}


def _child(role: str, arg: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "hbmserve.ops.bench.door_cpu", "--serve", role, arg],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if not line.startswith("http://"):
        proc.kill()
        raise RuntimeError(f"{role} did not start: {line!r}")
    proc.url = line  # type: ignore[attr-defined]
    return proc


def _replica(token: str):
    from hbmserve.core.config import ModelSpec
    from hbmserve.deployments.replica.engine_replica import replica_budget
    from hbmserve.deployments.replica.sim_server import SimHttpServer

    model = ModelSpec.model_validate(MODEL)
    return SimHttpServer(model, "127.0.0.1", replica_budget(model), token)


async def _serve_replica(token: str) -> None:
    print(await _replica(token).start(), flush=True)
    await asyncio.Event().wait()


def _door(token: str, url: str):
    from hbmserve.core.config import ClusterSpec
    from hbmserve.core.records import ReplicaEndpoint
    from hbmserve.deployments.wire.names import engine_deployment_name
    from hbmserve.ops.sim_door import SimDoor

    if os.environ.get("HBMSERVE_BENCH_PUSH") == "0":
        from hbmserve.deployments.ingress import front_door_app

        front_door_app.pushing = lambda send, scope: send  # every chunk through ASGI `send`
    limit = int(os.environ.get("HBMSERVE_BENCH_MIGRATION_LIMIT", "3"))
    spec = ClusterSpec.model_validate({"name": "door-cpu", "serve": {"migration_limit": limit}, "models": [MODEL]})
    m = spec.models[0]
    ep = ReplicaEndpoint(app=m.name, deployment=engine_deployment_name(m), replica="r0", model=m.name, url=url,
                         node_id="local", at=0.0)
    return SimDoor(spec, endpoints=[ep], token=token)


async def _serve_door(arg: str) -> None:
    token, url = arg.split("@", 1)
    async with _door(token, url) as door:
        print(door.url, flush=True)
        await asyncio.Event().wait()


async def _serve_inproc(token: str) -> None:
    """A replica and a door in one process, the door calling the replica's app directly."""
    from hbmserve.ops.bench.inproc_door import InProcessPool

    replica = _replica(token)
    url = await replica.start()  # its listener answers the door's load polls
    async with _door(token, url) as door:
        door.app.upstream = InProcessPool(replica.listener._server.cap)  # the app the listener serves, its cap included
        print(door.url, flush=True)
        await asyncio.Event().wait()


async def _serve_pyrelay(url: str) -> None:
    from hbmserve.ops.bench.pyrelay import PyRelay

    host, port = url.removeprefix("http://").rsplit(":", 1)
    print(await PyRelay(host, int(port)).serve(), flush=True)
    await asyncio.Event().wait()


async def _serve_asgirelay(arg: str) -> None:
    from hbmserve.deployments.wire.hardened_http import HardenedServer, HttpLimits, listen_socket
    from hbmserve.ops.bench.pyrelay import asgi_relay

    token, url = arg.split("@", 1)
    sock = listen_socket("127.0.0.1", 0, shared=False)
    await HardenedServer(asgi_relay(url, token), HttpLimits()).start([sock])
    print("http://{}:{}".format(*sock.getsockname()[:2]), flush=True)
    await asyncio.Event().wait()


async def _stream_all(url: str, token: str, concurrency: int, requests: int, tokens: int) -> int:
    import aiohttp

    body = {"model": "sim", "prompt": "x" * 256, "max_tokens": tokens, "stream": True}
    headers = {INTERNAL_TOKEN_HEADER.decode(): token}  # the door drops it; the replica needs it
    left = requests
    got = 0

    async def worker(session) -> None:
        nonlocal left, got
        while left > 0:
            left -= 1
            async with session.post(f"{url}/v1/completions", json=body, headers=headers) as r:
                if r.status != 200:
                    raise RuntimeError(f"{r.status}: {await r.text()}")
                async for line in r.content:
                    got += line.startswith(b"data: {")

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return got


def _haproxy(replica_url: str) -> subprocess.Popen:
    import socket

    from hbmserve.ops.bench.serving_overhead import start_haproxy

    with socket.socket() as s:  # a free port for HAProxy's listener
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = start_haproxy(int(replica_url.rsplit(":", 1)[1]), port, no_delay=True)
    proc.url = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("HAProxy did not start") from None
            time.sleep(0.2)


def one_run(side: str, servers: dict, token: str, args) -> dict:
    url = servers["replica" if side == "direct" else side].url
    pids = {name: p.pid for name, p in servers.items()}
    before = {k: cpu_s(p) for k, p in pids.items()}
    t0 = time.perf_counter()
    got = asyncio.run(_stream_all(url, token, args.concurrency, args.requests, args.tokens))
    wall = time.perf_counter() - t0
    used = {k: cpu_s(p) - before[k] for k, p in pids.items()}
    return {"side": side, "tokens": got, "wall_s": round(wall, 2), "tok_s": round(got / wall, 1),
            **{f"{k}_cpu_ms_per_1k": round(1e6 * v / max(got, 1), 1) for k, v in used.items()}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--sides", nargs="+", choices=("direct", "door", "haproxy", "inproc", "pyrelay", "asgirelay"), default=["direct", "door"])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)  # a child: replica TOKEN | door TOKEN@URL | inproc TOKEN | pyrelay URL | asgirelay TOKEN@URL
    args = ap.parse_args(argv)
    if args.serve:
        role, arg = args.serve
        serve = {"replica": _serve_replica, "door": _serve_door, "inproc": _serve_inproc,
                 "pyrelay": _serve_pyrelay, "asgirelay": _serve_asgirelay}[role](arg)
        if os.environ.get("HBMSERVE_BENCH_LOOP") == "uvloop" and role != "replica":
            import uvloop

            uvloop.run(serve)
        else:
            asyncio.run(serve)
        return
    token = os.urandom(8).hex()
    replica = _child("replica", token)
    servers = {"replica": replica, "door": _child("door", f"{token}@{replica.url}")}
    rows = []
    try:
        if "haproxy" in args.sides:
            servers["haproxy"] = _haproxy(replica.url)
        if "inproc" in args.sides:
            servers["inproc"] = _child("inproc", token)
        if "pyrelay" in args.sides:
            servers["pyrelay"] = _child("pyrelay", replica.url)
        if "asgirelay" in args.sides:
            servers["asgirelay"] = _child("asgirelay", f"{token}@{replica.url}")
        for side in args.sides:  # each way warmed up alike
            asyncio.run(_stream_all(servers["replica" if side == "direct" else side].url, token, args.concurrency,
                                    args.concurrency, 16))
        for r in range(args.rounds):
            for side in args.sides:
                rows.append({"round": r, **one_run(side, servers, token, args)})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        for p in servers.values():
            p.kill()
            p.wait()
    for side in args.sides:
        mine = [x for x in rows if x["side"] == side]
        cpu = "; ".join(f"{k} {[x[f'{k}_cpu_ms_per_1k'] for x in mine]}" for k in servers)
        print(f"{side}: tok/s median {statistics.median(x['tok_s'] for x in mine):,.0f}; CPU-ms/1k tokens: {cpu}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "rounds": rows}, indent=1))


if __name__ == "__main__":
    main()
