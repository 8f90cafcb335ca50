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

`--trace PATH` adds rounds shaped like real traffic: each request asks for the next output length of
the trace (capped at `--cap`, so that a reply fits the model's context), and the report is CPU per
1,000 output tokens. Short outputs cost the door more per token than the engine, long ones less, so
the door's share of the engine's CPU on real traffic depends on the mix. The trace's prompts are
not replayed (the same short prompt each time: the engine's prefill, which would only lower the
door's share, stays small) and neither is its timing (`--concurrency` clients back to back).

    python -m hbmserve.ops.bench.door_split --tokens 1 32 --rounds 2 --seconds 20
    python -m hbmserve.ops.bench.door_split --tokens 1 32 --trace ../shared/data/traces/azure_llm_2023_conv.csv
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

from hbmserve.ops.bench.cpu_split import CpuMeter


async def stream_for(url: str, model: str, seconds: float, tokens: int | Iterator[int],
                     concurrency: int) -> tuple[int, int]:
    """Completed streams in `seconds`, `concurrency` at a time, and the tokens they carried: each of
    `tokens` tokens, or of the next length `tokens` yields."""
    import aiohttp

    lengths = itertools.repeat(tokens) if isinstance(tokens, int) else tokens
    end = time.monotonic() + seconds
    done = carried = 0

    async def client(session) -> None:
        nonlocal done, carried
        while time.monotonic() < end:
            n = next(lengths)
            body = {"model": model, "prompt": "hello " * 60, "max_tokens": n, "stream": True, "ignore_eos": True}
            async with session.post(f"{url}/v1/completions", json=body) as r:
                if r.status != 200:
                    raise RuntimeError(f"{r.status}: {await r.text()}")
                async for _ in r.content:
                    pass
            done, carried = done + 1, carried + n

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    return done, carried


def trace_lengths(path: Path, cap: int) -> list[int]:
    """The trace's output lengths in its order, each capped."""
    from hbmserve.capacity.traces.arrivals import read_trace

    return [min(int(n), cap) for n in read_trace(path).output.tolist()]


def measure(args) -> dict:
    with CpuMeter() as m:
        time.sleep(args.idle)
    out = {"idle_door_cores": m.split.seconds["door"] / args.idle, "runs": []}
    for tokens in args.tokens:
        asyncio.run(stream_for(args.url, args.model, 5.0, tokens, args.concurrency))
        for r in range(args.rounds):
            m, n, _, wall = _timed(args, tokens)
            per = {g: round(1e3 * s / max(n, 1), 3) for g, s in m.split.seconds.items()}  # ms a request
            out["runs"].append({"tokens": tokens, "round": r, "requests_per_s": round(n / wall, 1), "ms_per_request": per,
                                "door_per_engine": _share(per)})
            print(json.dumps(out["runs"][-1]), flush=True)
    if args.trace is not None:
        lengths = itertools.cycle(trace_lengths(args.trace, args.cap))  # every round goes on where the last stopped
        asyncio.run(stream_for(args.url, args.model, 5.0, lengths, args.concurrency))
        out["trace"] = []
        for r in range(args.rounds):
            m, n, carried, wall = _timed(args, lengths)
            per = m.split.per_1k(carried)  # CPU-seconds per 1,000 output tokens
            out["trace"].append({"round": r, "requests": n, "tokens": carried, "tokens_per_s": round(carried / wall, 1),
                                 "cpu_s_per_1k_tokens": per, "door_per_engine": _share(per)})
            print(json.dumps(out["trace"][-1]), flush=True)
    return out


def _timed(args, tokens: int | Iterator[int]) -> tuple[CpuMeter, int, int, float]:
    """One measured run: the CPU meter, the streams and tokens completed, and the wall time."""
    with CpuMeter() as m:
        t0 = time.monotonic()
        n, carried = asyncio.run(stream_for(args.url, args.model, args.seconds, tokens, args.concurrency))
        wall = time.monotonic() - t0
    return m, n, carried, wall


def _share(per: dict[str, float]) -> float | None:
    """The door's CPU as a share of the engine's (issue 22's target: at most 0.10)."""
    return round(per["door"] / per["engine"], 3) if per.get("engine") else None


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
    ap.add_argument("--trace", type=Path, help="also rounds with this trace's output lengths (CSV or JSONL trace)")
    ap.add_argument("--cap", type=int, default=800, help="the most tokens a trace's request asks for")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    out = measure(args)
    out["split"] = split(out)
    print(f"idle door: {100 * out['idle_door_cores']:.1f}% of a core; split: {out['split']}")
    if out.get("trace"):
        print(f"door / engine on the trace's outputs, per round: {[r['door_per_engine'] for r in out['trace']]}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        given = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        args.out.write_text(json.dumps({"args": given, **out}, indent=1))


if __name__ == "__main__":
    main()
