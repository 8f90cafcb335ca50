"""Fixtures shared by the CLI tests."""

from __future__ import annotations

import pytest

import hbmserve.cli.serve as serve_cli
from hbmserve.cluster import local_head as lh, ray_cluster as rc


@pytest.fixture
def started(monkeypatch) -> list[str]:
    """`up` and `deploy` with every step that would start something (the tiny model, the Ray head,
    the connection, the deploy) replaced by a recorder: the list names the steps reached, so a
    command refused before anything starts leaves it empty."""
    calls: list[str] = []
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setattr(lh, "local_head_running", lambda: False)
    monkeypatch.setattr(lh, "start_local_head", lambda *a: calls.append("head"))
    monkeypatch.setattr(rc, "connect", lambda address: calls.append("connect") or "127.0.0.1:6379")
    monkeypatch.setattr(serve_cli, "_ensure_local_models", lambda spec: calls.append("models"))
    monkeypatch.setattr(serve_cli, "_deploy", lambda spec: calls.append("deploy") or
                        {m.name: "http://127.0.0.1:1" for m in spec.models})
    # `deploy` first asks whether only some models changed; here nothing is deployed yet.
    monkeypatch.setattr(serve_cli, "update_running", lambda spec, err, out: None)
    return calls
