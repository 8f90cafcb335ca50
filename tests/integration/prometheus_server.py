"""A real Prometheus server for tests: scrapes the given targets on loopback every second.

    with prometheus_server(["127.0.0.1:44715"], tmp_path) as prom:
        prom.wait_for('some_metric{app="x"}', lambda v: v == 1.0, timeout_s=60)

Installed from Debian by `make test` (Makefile `system-deps`); tests skip with a reason where it
is missing. Nothing is started as a service: the server is this process's child and is stopped
on exit.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable

from tests.integration.conftest import stop_process

import httpx
import pytest


def backfill(openmetrics: str, workdir: Path) -> Path:
    """A Prometheus data folder holding the samples of `openmetrics` (text ending "# EOF", times in
    seconds), written by promtool's own backfill, for `prometheus_server(tsdb=...)`."""
    binary = shutil.which("promtool")
    if binary is None:
        pytest.skip("promtool not installed (`make test` installs Debian's prometheus package)")
    source, tsdb = workdir / "history.om", workdir / "backfilled"
    source.write_text(openmetrics)
    done = subprocess.run([binary, "tsdb", "create-blocks-from", "openmetrics", str(source), str(tsdb)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return tsdb


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    def __init__(self, url: str):
        self.url = url

    def query(self, expr: str) -> list[tuple[dict, float]]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        r.raise_for_status()
        return [(s["metric"], float(s["value"][1])) for s in r.json()["data"]["result"]]

    def answer(self, expr: str) -> dict:
        """The API's whole answer at now, an error included (status "error", its errorType and error)."""
        return httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10).json()

    def wait_for(self, expr: str, ok: Callable[[float], bool], timeout_s: float) -> list[tuple[dict, float]]:
        """The query's samples once it returns exactly one that passes `ok` (or the last answer)."""
        deadline = time.monotonic() + timeout_s
        while True:
            samples = self.query(expr)
            if (len(samples) == 1 and ok(samples[0][1])) or time.monotonic() > deadline:
                return samples
            time.sleep(1)


@contextlib.contextmanager
def prometheus_server(targets: list[str], workdir: Path, doors: list[str] = (), admin_token: str | None = None,
                      tsdb: Path | None = None):
    """`doors`: front doors scraped at /metrics with `admin_token` as a bearer token (job
    hbmserve-doors), beside the plain `targets` (job hbmserve: Ray's metrics ports). `tsdb`: a
    data folder to serve (one `backfill` wrote); default: a new one in `workdir`."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus not installed (`make test` installs Debian's package)")
    for target in [*targets, *doors]:
        assert target.startswith(("127.", "localhost:")), f"scrape loopback only, not {target}"
    config = workdir / "prometheus.yml"
    listed = ", ".join(f'"{t}"' for t in targets)
    text = ("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"scrape_configs:\n  - job_name: hbmserve\n    static_configs: [{{targets: [{listed}]}}]\n")
    if doors:
        token_file = workdir / "admin-token"
        token_file.write_text(admin_token or "")
        listed = ", ".join(f'"{t}"' for t in doors)
        text += (f"  - job_name: hbmserve-doors\n    metrics_path: /metrics\n"
                 f"    authorization: {{credentials_file: {token_file}}}\n"
                 f"    static_configs: [{{targets: [{listed}]}}]\n")
    config.write_text(text)
    port = _free_port()
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tsdb or workdir / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prometheus did not start: {proc.stderr.read().decode()[-2000:]}")
            time.sleep(0.2)
        yield Prometheus(url)
    finally:
        stop_process(proc, 20)
