"""Ray locked by default (cluster/ray_auth.py, cluster/checks.py `exposure`): the token kept 0600,
the head and client environments, and `up`/`deploy` refusing what an unauthenticated client
could reach unless --insecure, through the installed CLI before anything starts. The live check
of every port a default `up` opens is tests/integration/test_up_lifecycle.py."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hbmserve.cluster import ray_auth
from hbmserve.cluster.checks import exposure, is_loopback
from hbmserve.core.config import parse_cluster_spec

HBMSERVE = str(Path(sys.executable).parent / "hbmserve")


@pytest.fixture
def token_file(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "ray" / "auth_token"
    for var in (ray_auth.MODE_ENV, ray_auth.TOKEN_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(ray_auth.TOKEN_PATH_ENV, str(path))
    return path


def test_the_head_gets_token_mode_and_a_private_token(token_file):
    assert ray_auth.client_env() == {}  # no token kept yet: nothing to send
    env = ray_auth.head_env()
    assert env == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600 and len(token_file.read_text()) == 64
    first = token_file.read_text()
    ray_auth.head_env()
    assert token_file.read_text() == first  # kept across heads: running clients stay valid
    assert ray_auth.client_env() == env


def test_a_loose_token_file_is_tightened(token_file):
    token_file.parent.mkdir()
    token_file.write_text("abc")
    token_file.chmod(0o644)
    ray_auth.ensure_token()
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600 and token_file.read_text() == "abc"


def test_the_caller_s_own_mode_stands(token_file, monkeypatch):
    ray_auth.ensure_token()
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert ray_auth.client_env() == {} and not ray_auth.head_auth_on() and ray_auth.head_env() == {}


def _spec(host: str, auth: bool, tmp_path: Path):
    serve = {"http": {"host": host}}
    if auth:
        keys = tmp_path / "keys.yaml"
        keys.write_text("tenants: [{name: a, keys: [k-0123456789abcdef]}]\n")
        serve["auth"] = {"keys_file": str(keys)}
    return parse_cluster_spec({"serve": serve, "models": [{"name": "m", "source": "simulated", "engine": "sim"}]})


def test_exposure_names_an_open_front_door_and_an_open_ray(tmp_path):
    assert exposure(_spec("127.0.0.1", False, tmp_path), ray_auth=True) == []
    assert exposure(_spec("0.0.0.0", True, tmp_path), ray_auth=True) == []
    (door,) = exposure(_spec("0.0.0.0", False, tmp_path), ray_auth=True)
    assert "0.0.0.0:8000" in door and "/hbm/*" in door and "serve.auth" in door
    (ray,) = exposure(_spec("::1", False, tmp_path), ray_auth=False)
    assert "token authentication" in ray
    assert is_loopback("localhost") and is_loopback("127.0.0.2") and not is_loopback("example.com")


@pytest.mark.parametrize("command", ["up", "deploy"])
def test_an_open_front_door_is_refused_before_ray_starts_unless_insecure(command, tmp_path):
    cfg = tmp_path / "open.yaml"
    cfg.write_text("serve: {http: {host: 0.0.0.0, port: 18999}}\nmodels: [{name: m, source: simulated, engine: sim}]\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_ADDRESS": "127.0.0.1:1"}
    refused = subprocess.run([HBMSERVE, command, str(cfg)], capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode == 2, refused.stderr
    assert "refusing to serve without authentication" in refused.stderr and "--insecure" in refused.stderr
    # With --insecure it goes on (to the unreachable cluster named above) and says what is exposed.
    allowed = subprocess.run([HBMSERVE, command, "--insecure", str(cfg)], capture_output=True, text=True,
                             timeout=60, env=env)
    assert "insecure:" in allowed.stderr and "0.0.0.0:18999" in allowed.stderr
    assert "no Ray cluster answers at 127.0.0.1:1" in allowed.stderr + allowed.stdout


def test_ray_env_prints_the_one_step_or_says_there_is_no_head_token(tmp_path):
    path = tmp_path / "auth_token"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")} | {"RAY_AUTH_TOKEN_PATH": str(path)}
    missing = subprocess.run([HBMSERVE, "ray-env"], capture_output=True, text=True, timeout=60, env=env)
    assert missing.returncode == 1 and "hbmserve up" in missing.stderr
    path.write_text("t" * 64)
    shown = subprocess.run([HBMSERVE, "ray-env"], capture_output=True, text=True, timeout=60, env=env)
    assert shown.returncode == 0
    lines = shown.stdout.splitlines()
    assert lines[:2] == ["export RAY_AUTH_MODE=token", f"export RAY_AUTH_TOKEN_PATH={path}"]
    # While a loopback head runs here (another test's), its single-machine mode comes too.
    assert lines[2:] in ([], ["export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0"])
