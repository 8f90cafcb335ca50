"""A header flood against hbmserve's listener (issue 21, requirement 1): what an unauthenticated
client costs the server with and without the header caps, side by side in one run.

One connection sends the start of a request and then 8 KiB header lines without ever ending the
header block, up to --flood-mib, against a `deployments/wire/hardened_http.py` server in this process:
first with the shipped defaults, then with the caps lifted (as the listeners were before them:
only the header deadline). For each: the bytes the client got in before the server answered or
hung up, the answer's status line, and how much this process's RSS grew meanwhile.

    python -m hbmserve.ops.bench.header_flood --flood-mib 256 --out out/header_flood.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import psutil

from hbmserve.deployments.wire.hardened_http import HardenedServer, HttpLimits, listen_socket

LINE = b"x-filler: " + b"a" * 8180 + b"\r\n"
UNCAPPED = HttpLimits(header_timeout_s=10.0, max_header_bytes=2**62, max_headers=2**30, idle_connection_s=60.0)


async def _ok(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def send_flood(port: int, flood_bytes: int, timeout_s: float = 12.0) -> tuple[int, bytes, int]:
    """One flooding connection to 127.0.0.1:`port`, until the server answers or hangs up: the
    bytes sent, the first bytes answered, and how many bytes this process's RSS grew."""
    rss = psutil.Process().memory_info().rss
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answer = asyncio.create_task(reader.read(4096))
    sent = 0
    writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n")
    try:
        while sent < flood_bytes and not answer.done():
            writer.write(LINE)
            sent += len(LINE)
            await asyncio.wait_for(writer.drain(), timeout=timeout_s)
    except (ConnectionError, asyncio.TimeoutError):
        pass
    grown = psutil.Process().memory_info().rss - rss
    got = await asyncio.wait_for(answer, timeout=timeout_s + 3)
    writer.close()
    return sent, got, grown


async def flood(limits: HttpLimits, flood_bytes: int) -> dict[str, object]:
    sock = listen_socket("127.0.0.1", 0, shared=False)
    server = HardenedServer(_ok, limits)
    await server.start([sock])
    try:
        sent, got, grown = await send_flood(sock.getsockname()[1], flood_bytes, limits.header_timeout_s + 2)
    finally:
        await server.stop()
    return {"sent_bytes": sent, "answer": got.split(b"\r\n", 1)[0].decode(errors="replace") or "(closed)",
            "rss_growth_mib": round(grown / 2**20, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flood-mib", type=int, default=256)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    # The capped run first: memory the uncapped one freed could otherwise be reused unseen.
    rows = {"shipped limits": asyncio.run(flood(HttpLimits(), args.flood_mib * 2**20)),
            "uncapped (header deadline only)": asyncio.run(flood(UNCAPPED, args.flood_mib * 2**20))}
    for name, r in rows.items():
        print(f"{name:32} sent {r['sent_bytes'] / 2**20:8.2f} MiB  answer {r['answer']!r:40}  "
              f"RSS +{r['rss_growth_mib']} MiB")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"flood_mib": args.flood_mib, "line_bytes": len(LINE), "runs": rows}, indent=2))


if __name__ == "__main__":
    main()
