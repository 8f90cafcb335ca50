"""Admission decisions and the ASGI middleware that applies them on the data path."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hbmserve.routing.replica_cap import Admit, AdmissionBudget, Reject, AdmissionLoad, admit_to_replica
from hbmserve.deployments.replica.replica_http import EngineLoad
from hbmserve.deployments.replica.replica_middleware import LoadCounters, ReplicaMiddleware


def test_admits_below_budget_and_rejects_at_it():
    b = AdmissionBudget(max_in_flight=4)
    assert isinstance(admit_to_replica(AdmissionLoad(3), b), Admit)
    r = admit_to_replica(AdmissionLoad(4), b)
    assert isinstance(r, Reject)
    assert "4 requests in flight (limit 4)" in r.reason
    assert r.retry_after_s == 1  # no pace known yet: the default


def test_retry_after_drains_excess_at_observed_pace():
    # 10 in flight, limit 4: 7 must finish before a slot frees; at 2 rps that is 3.5 s -> 4.
    r = admit_to_replica(AdmissionLoad(10, completion_rate_rps=2.0), AdmissionBudget(4))
    assert isinstance(r, Reject) and r.retry_after_s == 4


@given(st.integers(0, 10_000), st.integers(1, 1000), st.none() | st.floats(0.01, 1000))
def test_admission_is_a_threshold_with_positive_retry(in_flight, limit, rate):
    d = admit_to_replica(AdmissionLoad(in_flight, rate), AdmissionBudget(limit))
    assert isinstance(d, Admit) == (in_flight < limit)
    if isinstance(d, Reject):
        assert d.retry_after_s >= 1


class _Engine:
    """A downstream ASGI app that streams two chunks, the second released by an event."""

    def __init__(self):
        self.release = asyncio.Event()

    async def __call__(self, scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await self.release.wait()
        await send({"type": "http.response.body", "body": b"b"})


TOKEN = "internal-token-of-this-deploy"
FRONT_DOOR = {"x-hbmserve-internal": TOKEN}


def _middleware(engine, budget: AdmissionBudget, counters: LoadCounters) -> ReplicaMiddleware:
    return ReplicaMiddleware(engine, budget, TOKEN, counters, lambda: EngineLoad(waiting=2, running=3, kv_usage=0.5))


async def _call(app, path: str, headers: dict[str, str] | None = FRONT_DOOR) -> tuple[int, dict[str, str], bytes]:
    """Drive one ASGI request by hand, the way an ASGI server would."""
    scope = {"type": "http", "method": "POST", "path": path,
             "headers": [(k.encode(), v.encode()) for k, v in (headers or {}).items()]}
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    start = sent[0]
    return (start["status"], {k.decode(): v.decode() for k, v in start["headers"]},
            b"".join(m.get("body", b"") for m in sent[1:]))


def test_middleware_rejects_over_budget_with_openai_error_and_retry_after():
    async def run():
        engine = _Engine()
        counters = LoadCounters()
        mw = _middleware(engine, AdmissionBudget(1), counters)
        first = asyncio.create_task(_call(mw, "/v1/completions"))
        while counters.in_flight == 0:
            await asyncio.sleep(0.01)
        second = await _call(mw, "/v1/chat/completions")
        engine.release.set()
        models = await _call(mw, "/v1/models")  # never admission-controlled
        return await first, second, models, counters

    ok, (status, headers, body), models, counters = asyncio.run(run())
    assert ok[0] == 200 and ok[2] == b"ab"
    assert status == 429
    assert headers["retry-after"] == "1"
    err = json.loads(body)["error"]
    assert err["type"] == "rate_limit_error" and "limit 1" in err["message"]
    assert models[0] == 200
    assert (counters.accepted, counters.rejected, counters.in_flight) == (1, 1, 0)
    assert len(counters.first_byte_s) == 1


@pytest.mark.parametrize(("headers", "status"), [({}, 403), ({"x-hbmserve-internal": "guess"}, 403),
                                                  ({"authorization": f"Bearer {TOKEN}"}, 403), (FRONT_DOOR, 200)])
def test_only_the_front_door_is_served_and_health_is_open(headers, status):
    async def run():
        engine = _Engine()
        engine.release.set()
        mw = _middleware(engine, AdmissionBudget(8), LoadCounters())
        return await _call(mw, "/v1/models", headers), await _call(mw, "/health", {})

    v1, health = asyncio.run(run())
    assert v1[0] == status
    if status == 403:
        assert json.loads(v1[2])["error"]["code"] == "not_front_door"
    assert health[0] == 200


def test_the_load_report_is_the_engine_gauges_and_the_counters():
    async def run():
        counters = LoadCounters(in_flight=1, accepted=9, rejected=2)
        return await _call(_middleware(_Engine(), AdmissionBudget(8), counters), "/hbm/load")

    status, _, body = asyncio.run(run())
    assert status == 200
    assert json.loads(body) == {"waiting": 2, "running": 3, "kv_usage": 0.5, "in_flight": 1, "accepted": 9,
                                "rejected": 2, "prompt_tokens": 0, "prefix_hit_tokens": 0,
                                "adapters": {"resident": [], "slots": 0, "loads": [], "unloads": []}}
