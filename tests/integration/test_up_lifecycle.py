"""`hbmserve up` (serving in the foreground) as a user runs it: it exits with a message when
another terminal runs `hbmserve down`, and it always stops on Ctrl-C. Simulated engine, local
head on loopback; `down` before and after (see conftest.local_head on the head's one owner)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx
import pytest

from hbmserve.cli.serve import CLEANUP_S
from tests.integration.conftest import HBMSERVE, run_cli

pytestmark = pytest.mark.integration
PORT = 18600


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    cfg = tmp_path_factory.mktemp("up-config") / "cluster.yaml"
    cfg.write_text(f"""name: hbmserve-up-test
serve: {{http: {{host: 127.0.0.1, port: {PORT}}}}}
models:
  - name: sim-up
    source: simulated
    engine: sim
    sim: {{gpu: h100-sxm, model_config_name: llama-3.1-8b, speedup: 20}}
""")
    return cfg


def _start_up(config) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    run_cli("down", timeout=120, env=env)
    proc = subprocess.Popen([HBMSERVE, "up", str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{PORT}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise AssertionError(f"`hbmserve up` exited early:\n{proc.stdout.read()}")
        time.sleep(1)
    proc.kill()
    raise AssertionError("`hbmserve up` did not start serving in 300 s")


def _finish(proc: subprocess.Popen, timeout_s: float) -> tuple[int | None, str]:
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        proc.kill()
        return None, proc.communicate()[0]


def test_up_exits_with_a_message_when_down_runs_elsewhere(config):
    proc = _start_up(config)
    try:
        assert run_cli("down", timeout=180).returncode == 0
        code, out = _finish(proc, timeout_s=60)
    finally:
        run_cli("down", timeout=180)
    assert code is not None, f"`up` kept waiting after `down`:\n{out}"
    assert any(why in out for why in ("is gone", "was removed", "was shut down")), out
    assert "stopped" in out


def test_up_stops_on_ctrl_c(config):
    proc = _start_up(config)
    try:
        proc.send_signal(signal.SIGINT)
        # `up` may take its whole clean-up budget on a loaded machine before it says "stopped".
        code, out = _finish(proc, timeout_s=CLEANUP_S + 30)
    finally:
        run_cli("down", timeout=180)
    assert code is not None, f"`up` ignored Ctrl-C:\n{out}"
    assert "stopped" in out
