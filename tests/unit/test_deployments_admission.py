"""Admission decisions and the ASGI middleware that applies them on the data path."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hbmserve.routing.admission import Admit, AdmissionBudget, Reject, AdmissionLoad, admit
from hbmserve.access.keys import KeysFileError, parse_admin_token, parse_keys_file
from hbmserve.core.config import AuthSpec
from hbmserve.deployments.ingress_middleware import IngressMiddleware, LoadCounters, load_key_ring


def test_admits_below_budget_and_rejects_at_it():
    b = AdmissionBudget(max_in_flight=4)
    assert isinstance(admit(AdmissionLoad(3), b), Admit)
    r = admit(AdmissionLoad(4), b)
    assert isinstance(r, Reject)
    assert "4 requests in flight (limit 4)" in r.reason
    assert r.retry_after_s == 1  # no pace known yet: the default


def test_retry_after_drains_excess_at_observed_pace():
    # 10 in flight, limit 4: 7 must finish before a slot frees; at 2 rps that is 3.5 s -> 4.
    r = admit(AdmissionLoad(10, completion_rate_rps=2.0), AdmissionBudget(4))
    assert isinstance(r, Reject) and r.retry_after_s == 4


@given(st.integers(0, 10_000), st.integers(1, 1000), st.none() | st.floats(0.01, 1000))
def test_admission_is_a_threshold_with_positive_retry(in_flight, limit, rate):
    d = admit(AdmissionLoad(in_flight, rate), AdmissionBudget(limit))
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


async def _call(app, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
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
        mw = IngressMiddleware(engine, AdmissionBudget(1), None, counters)
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


_KEYS = "tenants: [{name: a, keys: [k1-0123456789abcdef, k2-0123456789abcdef]}]"
_ADMIN = "admin-0123456789abcdef"


@pytest.mark.parametrize(("path", "header", "status"), [
    ("/v1/models", None, 401), ("/v1/models", "Bearer wrong-0123456789abcdef", 401),
    ("/v1/models", "Bearer k1-0123456789abcdef", 200), ("/v1/models", f"Bearer {_ADMIN}", 401),
    ("/metrics", None, 401), ("/metrics", "Bearer k1-0123456789abcdef", 403), ("/metrics", f"Bearer {_ADMIN}", 200),
    ("/health", None, 200),
])
def test_middleware_authorizes_by_path_class(path, header, status):
    ring = dataclasses.replace(parse_keys_file(_KEYS, "keys.yaml"), admin_digest=parse_admin_token(_ADMIN, "t"))

    async def run():
        engine = _Engine()
        engine.release.set()
        mw = IngressMiddleware(engine, AdmissionBudget(8), ring, LoadCounters())
        return await _call(mw, path, {"authorization": header} if header else {})

    got, _, body = asyncio.run(run())
    assert got == status
    if status != 200:
        assert json.loads(body)["error"]["code"] in ("invalid_api_key", "invalid_admin_token", "admin_token_required")


def test_load_key_ring_fails_closed_on_a_missing_file(tmp_path):
    assert load_key_ring(None) is None
    with pytest.raises(KeysFileError, match=r"keys file \(serve.auth.keys_file\) .*missing.yaml"):
        load_key_ring(AuthSpec(keys_file=str(tmp_path / "missing.yaml")))
    keys, token = tmp_path / "keys.yaml", tmp_path / "admin"
    keys.write_text(_KEYS)
    token.write_text(_ADMIN + "\n")
    ring = load_key_ring(AuthSpec(keys_file=str(keys), admin_token_file=str(token)))
    assert ring is not None and ring.admin_digest is not None and len(ring.keys) == 2
