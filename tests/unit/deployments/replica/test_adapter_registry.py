"""The replica's adapter registry (issue 25): registers an adapter on a request's demand, within
its slots, evicting the least recently used idle one, never one in use; and the middleware runs
each request naming an adapter through it."""

from __future__ import annotations

import asyncio

import pytest

from hbmserve.deployments.replica.replica_middleware import AdapterLoadError, AdapterRegistry
from hbmserve.deployments.ingress.relay import upstream_headers


def registry(slots=2, fail=()):
    calls: list[tuple[str, str]] = []

    async def load(name, path):
        await asyncio.sleep(0.01)  # others arrive while it loads
        if name in fail:
            raise AdapterLoadError(f"cannot load {name}")
        calls.append(("load", name))

    async def unload(name):
        calls.append(("unload", name))

    return AdapterRegistry({n: f"/cache/{n}" for n in "abcd"}, slots, load, unload), calls


def test_loads_on_demand_and_evicts_the_least_recently_used_idle_adapter():
    async def go():
        reg, calls = registry()
        for n in "ab":
            await reg.acquire(n)
            reg.release(n)
        await reg.acquire("a")  # a is now the most recently used, and busy
        await reg.acquire("c")  # full: b is the idle one to go
        return reg, calls

    reg, calls = asyncio.run(go())
    assert calls == [("load", "a"), ("load", "b"), ("unload", "b"), ("load", "c")]
    assert tuple(reg.resident) == ("a", "c")
    h = reg.holding()
    assert h.resident == ("a", "c") and h.slots == 2
    assert dict(h.loads) == {"a": 1, "b": 1, "c": 1} and dict(h.unloads) == {"b": 1}


def test_concurrent_requests_for_one_adapter_load_it_once_and_busy_ones_are_never_evicted():
    async def go():
        reg, calls = registry(slots=1)
        await asyncio.gather(*(reg.acquire("a") for _ in range(5)))
        await reg.acquire("b")  # a is in use by 5: over-commit rather than refuse
        return reg, calls

    reg, calls = asyncio.run(go())
    assert calls == [("load", "a"), ("load", "b")]
    assert set(reg.resident) == {"a", "b"} and reg.busy == {"a": 5, "b": 1}


def test_a_failed_load_releases_its_claim_and_an_unknown_adapter_is_refused():
    async def go():
        reg, _ = registry(fail={"c"})
        with pytest.raises(AdapterLoadError, match="cannot load c"):
            await reg.acquire("c")
        with pytest.raises(AdapterLoadError, match="not one of this model's adapters"):
            await reg.acquire("zzz")
        return reg

    reg = asyncio.run(go())
    assert not reg.busy and "c" not in reg.resident


def test_a_client_cannot_name_the_adapter_to_the_replica_itself():
    sent = [(b"x-hbmserve-adapter", b"evil"), (b"X-HBMServe-Internal", b"guess"), (b"content-type", b"json")]
    assert upstream_headers(sent, "tok") == {"x-hbmserve-internal": "tok", "content-type": "json"}
    assert upstream_headers(sent, "tok", "sql")["x-hbmserve-adapter"] == "sql"
