"""`python -m hbmserve.ops.sim_door` as a subprocess, for the black-box tests of the front door."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def sim_door(config: Path, port: int):
    """Serves `config` on 127.0.0.1:`port` until the block ends; yields the URL once /health answers."""
    proc = subprocess.Popen([sys.executable, "-m", "hbmserve.ops.sim_door", "--config", str(config), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "no start"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
