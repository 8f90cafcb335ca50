"""The listener's caps count requests and per-address sockets, never silent sockets, and never
starve the probes (deployments/wire/hardened_http.py). On the listener before, uvicorn's `limit_concurrency`
counted open sockets: with the cap at 64, 63 silent sockets made `/health` answer 503.

Real loopback sockets; a second loopback address (127.0.0.2) plays the attacker so that the
per-address cap is seen to be per address."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from hbmserve.core.serve_spec import HttpSpec
from hbmserve.deployments.wire.hardened_http import HardenedServer, listen_socket
from hbmserve.deployments.wire.http_limits import HttpLimits

ATTACKER = "127.0.0.2"


def run(coro, timeout: float = 30):
    return asyncio.run(asyncio.wait_for(coro, timeout=timeout))


class Gate:
    """An app whose /slow requests wait until the gate opens; everything else answers at once."""

    def __init__(self):
        self.open = asyncio.Event()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        if scope["path"] == "/slow":
            await self.open.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


async def serving(app, limits: HttpLimits, refused: list | None = None) -> tuple[HardenedServer, str]:
    sock = listen_socket("127.0.0.1", 0, shared=False)
    server = HardenedServer(app, limits, on_refused=None if refused is None else refused.append)
    await server.start([sock])
    return server, f"http://127.0.0.1:{sock.getsockname()[1]}"


async def silent_socket(url: str, source: str = ATTACKER):
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port), local_addr=(source, 0))


async def first_answer(writer_reader) -> bytes:
    reader, _ = writer_reader
    return await asyncio.wait_for(reader.read(4096), timeout=5)


def test_silent_sockets_past_the_cap_leave_health_and_real_requests_served():
    async def scenario():
        # Deadlines longer than the test: every silent socket stays open (only the cap is tested).
        limits = HttpLimits(max_in_flight=64, max_connections_per_client=None, idle_connection_s=30,
                            header_timeout_s=30)
        server, url = await serving(Gate(), limits)
        probes, requests = [], []
        try:
            # The attack that took readiness down: 63 silent sockets, then 8 more a second.
            held = [await silent_socket(url) for _ in range(63)]
            async with httpx.AsyncClient(base_url=url, timeout=5) as client:
                for _ in range(20):
                    held += [await silent_socket(url) for _ in range(2)]  # 8/s
                    probes.append((await client.get("/health")).status_code)
                    requests.append((await client.get("/v1/models")).status_code)
                    await asyncio.sleep(0.25)
            open_now = server.connections
            for _, w in held:
                w.close()
            return probes, requests, open_now
        finally:
            await server.stop()

    probes, requests, open_now = run(scenario())
    assert open_now >= 64  # the attack did hold the cap's worth of sockets
    assert probes == [200] * 20 and requests == [200] * 20


def test_requests_past_the_in_flight_cap_get_429_with_retry_after_while_health_answers():
    async def scenario():
        gate = Gate()
        server, url = await serving(gate, HttpLimits(max_in_flight=16, max_connections_per_client=None), refused)
        try:
            async with httpx.AsyncClient(base_url=url, timeout=10, limits=httpx.Limits(max_connections=64)) as c:
                slow = [asyncio.create_task(c.get("/slow")) for _ in range(16)]
                while server.cap.in_flight < 16:
                    await asyncio.sleep(0.01)
                over = await c.get("/v1/completions")
                health = (await c.get("/health")).status_code
                gate.open.set()
                done = [r.status_code for r in await asyncio.gather(*slow)]
                after = (await c.get("/v1/completions")).status_code
            return over, health, done, after
        finally:
            await server.stop()

    refused: list[str] = []  # what the front door counts in its refusal metrics
    over, health, done, after = run(scenario())
    assert refused == ["server_busy"]
    assert over.status_code == 429 and over.headers["retry-after"] == "1"
    error = json.loads(over.content)["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "server_busy" and "16" in error["message"]
    assert health == 200
    assert done == [200] * 16 and after == 200  # the slow ones lost nothing; the cap frees


def test_one_address_gets_at_most_its_sockets_and_others_are_served():
    async def scenario():
        server, url = await serving(Gate(), HttpLimits(max_connections_per_client=8, idle_connection_s=5.0), refused)
        try:
            held = [await silent_socket(url) for _ in range(8)]
            over = await silent_socket(url)
            answer = await first_answer(over)
            async with httpx.AsyncClient(base_url=url, timeout=5) as client:
                other = (await client.get("/v1/models")).status_code  # from 127.0.0.1: its own count
            held.pop()[1].close()
            await asyncio.sleep(0.2)
            again = await silent_socket(url)
            again[1].write(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            freed = await first_answer(again)
            for _, w in [*held, over, again]:
                w.close()
            return answer, other, freed
        finally:
            await server.stop()

    refused: list[str] = []
    answer, other, freed = run(scenario())
    assert refused == ["too_many_connections"]
    assert answer.startswith(b"HTTP/1.1 429 ") and b"too many connections" in answer
    assert other == 200
    assert freed.startswith(b"HTTP/1.1 200 ")  # a closed socket gives its place back


def test_a_trusted_proxy_carries_more_sockets_than_one_client_may():
    async def scenario():
        limits = HttpLimits(max_connections_per_client=4, trusted_proxies=(f"{ATTACKER}/32",), idle_connection_s=5.0)
        server, url = await serving(Gate(), limits)
        try:
            socks = [await silent_socket(url) for _ in range(12)]
            for _, w in socks:
                w.write(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            answers = [await first_answer(s) for s in socks]
            for _, w in socks:
                w.close()
            return answers
        finally:
            await server.stop()

    assert all(a.startswith(b"HTTP/1.1 200 ") for a in run(scenario()))


def test_the_config_carries_the_caps_and_names_the_field_that_went():
    limits = HttpLimits.of(HttpSpec(max_in_flight=100, max_connections_per_client=5, trusted_proxies=["10.0.0.0/8"]))
    assert (limits.max_in_flight, limits.max_connections_per_client, limits.trusted_proxies) == (100, 5, ("10.0.0.0/8",))
    assert not limits.caps_client("10.1.2.3") and limits.caps_client("11.0.0.1")
    with pytest.raises(ValueError, match="max_connections is gone.*max_in_flight"):
        HttpSpec(max_connections=64)


def test_a_probe_from_a_full_address_is_answered_and_nothing_else_is():
    """A kubelet or a load balancer probes from an address that also carries traffic: with that
    address at its cap, its /health and /metrics get 200 (one each, then the close), any other
    request from it gets 429, a silent socket past the cap is refused within PROBATION_S, and
    the address still holds no more than its cap. From another address all is served."""
    from hbmserve.deployments.wire.http_limits import PROBATION_S

    async def ask(url: str, request: bytes) -> tuple[bytes, bool]:
        reader, writer = await silent_socket(url)
        writer.write(request)
        answer = await asyncio.wait_for(reader.read(4096), timeout=5)
        closed = await asyncio.wait_for(reader.read(1), timeout=5) == b""  # EOF: the door closed it
        writer.close()
        return answer, closed

    async def scenario():
        server, url = await serving(Gate(), HttpLimits(max_connections_per_client=8, idle_connection_s=30), refused)
        try:
            held = [await silent_socket(url) for _ in range(8)]
            health = await ask(url, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            metrics = await ask(url, b"GET /metrics?x=1 HTTP/1.1\r\nhost: x\r\n\r\n")
            work = await ask(url, b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            silent = await silent_socket(url)
            late = await first_answer(silent)
            waited = loop.time() - t0
            open_now = server.connections
            async with httpx.AsyncClient(base_url=url, timeout=5) as client:  # from 127.0.0.1
                other = [(await client.get(p)).status_code for p in ("/health", "/metrics", "/v1/models")]
            for _, w in [*held, silent]:
                w.close()
            return health, metrics, work, late, waited, open_now, other
        finally:
            await server.stop()

    refused: list[str] = []
    health, metrics, work, late, waited, open_now, other = run(scenario())
    assert health[0].startswith(b"HTTP/1.1 200 ") and health[1]
    assert metrics[0].startswith(b"HTTP/1.1 200 ") and metrics[1]
    assert work[0].startswith(b"HTTP/1.1 429 ") and b"too many connections" in work[0]
    assert late.startswith(b"HTTP/1.1 429 ") and PROBATION_S * 0.8 <= waited < PROBATION_S + 1
    assert open_now <= 8 + 1  # the cap's worth, and the silent one on probation
    assert other == [200, 200, 200]
    assert refused == ["too_many_connections"] * 2
