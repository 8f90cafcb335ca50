"""The front door's CPU in three parts, on a running hbmserve (issue 22): what it burns idle, what
each request costs, and what each streamed piece costs.

Against a cluster already up (`hbmserve up --detach`), it reads every process's CPU from /proc
(ops/bench/cpu_split.py groups them: door, replica, engine, Ray, client):
* idle: `--idle` seconds with no traffic: the door's polls, discovery and Ray's own threads;
* for each `--tokens` N: `--rounds` runs of `--seconds` with `--concurrency` clients streaming
  N-token completions back to back, after a short warm-up.
From the 1-token runs (one piece a request, `--tokens 1` must be among them) and the longest,
it splits the door's CPU per request into fixed (idle cores / requests a second), per request
and per piece, as docs/benchmarks.md reports it.

    python -m hbmserve.ops.bench.door_split --tokens 1 32 --rounds 2 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from hbmserve.ops.bench.cpu_split import CpuMeter


async def stream_for(url: str, model: str, seconds: float, tokens: int, concurrency: int) -> int:
    """Completed N-token streams in `seconds`, `concurrency` at a time."""
    import aiohttp

    body = {"model": model, "prompt": "hello " * 60, "max_tokens": tokens, "stream": True, "ignore_eos": True}
    end = time.monotonic() + seconds
    done = 0

    async def client(session) -> None:
        nonlocal done
        while time.monotonic() < end:
            async with session.post(f"{url}/v1/completions", json=body) as r:
                if r.status != 200:
                    raise RuntimeError(f"{r.status}: {await r.text()}")
                async for _ in r.content:
                    pass
            done += 1

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    return done


def measure(args) -> dict:
    with CpuMeter() as m:
        time.sleep(args.idle)
    out = {"idle_door_cores": m.split.seconds["door"] / args.idle, "runs": []}
    for tokens in args.tokens:
        asyncio.run(stream_for(args.url, args.model, 5.0, tokens, args.concurrency))
        for r in range(args.rounds):
            with CpuMeter() as m:
                t0 = time.monotonic()
                n = asyncio.run(stream_for(args.url, args.model, args.seconds, tokens, args.concurrency))
                wall = time.monotonic() - t0
            per = {g: round(1e3 * s / max(n, 1), 3) for g, s in m.split.seconds.items()}  # ms a request
            out["runs"].append({"tokens": tokens, "round": r, "requests_per_s": round(n / wall, 1), "ms_per_request": per})
            print(json.dumps(out["runs"][-1]), flush=True)
    return out


def split(out: dict) -> dict | None:
    """Fixed, per-request and per-piece door CPU (ms), from the 1-token and the longest runs."""
    by = {}
    for run in out["runs"]:
        by.setdefault(run["tokens"], []).append(run)
    if 1 not in by or len(by) < 2:
        return None
    longest = max(by)

    def fixed_and_door(runs):
        rate = statistics.median(r["requests_per_s"] for r in runs)
        return 1e3 * out["idle_door_cores"] / rate, statistics.median(r["ms_per_request"]["door"] for r in runs)

    fixed_1, door_1 = fixed_and_door(by[1])
    fixed_n, door_n = fixed_and_door(by[longest])
    per_request = door_1 - fixed_1
    per_piece = (door_n - fixed_n - per_request) / (longest - 1)
    return {"tokens": longest, "door_ms_per_request": round(door_n, 3), "fixed_ms": round(fixed_n, 3),
            "request_ms": round(per_request, 3), "piece_us": round(1e3 * per_piece, 1)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--idle", type=float, default=20.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    out = measure(args)
    out["split"] = split(out)
    print(f"idle door: {100 * out['idle_door_cores']:.1f}% of a core; split: {out['split']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, **out}, indent=1))


if __name__ == "__main__":
    main()
