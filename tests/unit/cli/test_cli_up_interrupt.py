"""`hbmserve up` and Ctrl-C at the edge of deploying: a KeyboardInterrupt raised inside a Ray call
can be swallowed there (seen in CI: `up` went on serving). The Ray side is replaced by recording
fakes; the signal is real (sent to this process), and so are `up`'s handlers."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import hbmserve.cli.serve as serve_cli
from hbmserve.cluster import local_head as lh, ray_cluster as rc


@pytest.fixture
def fake_cluster(monkeypatch, tmp_path: Path):
    calls: list[str] = []
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(lh, "local_head_running", lambda: True)  # not ours: nothing to stop
    monkeypatch.setattr(rc, "connect", lambda address: "127.0.0.1:6379")
    monkeypatch.setattr(serve_cli, "_ensure_local_models", lambda spec: None)
    monkeypatch.setattr(serve_cli, "_shut_down", lambda own_head, gone: calls.append("shut down"))
    monkeypatch.setattr(serve_cli, "_serve_until_stopped", lambda stop: calls.append("served") or None)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("models: [{name: m, source: simulated, engine: sim}]\n")
    previous = signal.getsignal(signal.SIGINT)
    yield calls, cfg
    signal.signal(signal.SIGINT, previous)


def _up(cfg: Path):
    app = typer.Typer()
    serve_cli.register(app)
    return CliRunner().invoke(app, ["up", str(cfg)])


def test_a_ctrl_c_swallowed_while_deploying_still_stops_up(fake_cluster, monkeypatch):
    calls, cfg = fake_cluster

    def deploy_that_swallows(spec):
        try:
            os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, as the front door comes up
        except KeyboardInterrupt:
            pass  # what a Ray call may do with it
        return {"m": "http://127.0.0.1:1/v1"}

    monkeypatch.setattr(serve_cli, "_deploy", deploy_that_swallows)
    r = _up(cfg)
    assert r.exit_code == 130, r.output
    assert calls == ["shut down"] and "interrupted while deploying" in r.output


def test_without_ctrl_c_up_serves_then_shuts_down(fake_cluster, monkeypatch):
    calls, cfg = fake_cluster
    monkeypatch.setattr(serve_cli, "_deploy", lambda spec: {"m": "http://127.0.0.1:1/v1"})
    r = _up(cfg)
    assert r.exit_code == 0, r.output
    assert calls == ["served", "shut down"]
