"""Fixtures for the weight cache tests: a real HTTP server on 127.0.0.1 that serves model files
with faults injected per request, and a small model on disk with its manifest.

Faults are queued per path and each request takes the next one:
  "404", "500"        that status
  "truncate"          announce the full length, send half, close the connection
  "short"             announce and send half (a server whose file is shorter than the manifest's)
  "corrupt"           the right length, one byte flipped
  "ignore-range"      answer a Range request with 200 and the whole file
  "stall"             send half, then hold the connection until the server stops
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import unquote

import pytest

from hbmserve.weights.manifest import MANIFEST_NAME, FileEntry, make_manifest


@dataclass
class FaultServer:
    files: dict[str, bytes]
    faults: dict[str, list[str]] = field(default_factory=dict)
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Range header)
    delay_s: float = 0.0  # before each model-file body: lets racing processes overlap
    stop: threading.Event = field(default_factory=threading.Event)
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)
    close: Callable[[], None] = lambda: None  # stop serving now (the fixture also stops it at teardown)

    def gets(self, path: str) -> int:
        return sum(1 for p, _ in self.requests if p == path)


def _handler(state: FaultServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out apart; Nagle would add 40 ms each

        def log_message(self, *args: object) -> None:
            return None

        def _send(self, status: int, body: bytes, length: int | None = None, extra: dict | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body) if length is None else length))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = unquote(self.path).removeprefix("/m/")  # the base URL carries a /m prefix, as real ones do
            with state.lock:
                state.requests.append((path, self.headers.get("Range")))
                queue = state.faults.get(path, [])
                fault = queue.pop(0) if queue else None
            if fault in ("404", "500") or path not in state.files:
                status = 500 if fault == "500" else 404
                self._send(status, b"", 0)
                return
            data = state.files[path]
            start = 0
            rng = self.headers.get("Range")
            if rng and fault != "ignore-range":
                start = int(rng.removeprefix("bytes=").split("-")[0])
            body = data[start:]
            if fault == "corrupt":
                body = body[:-1] + bytes([body[-1] ^ 0xFF])
            extra = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"} if start else {}
            half = body[: len(body) // 2]
            if path != MANIFEST_NAME and state.delay_s:
                state.stop.wait(state.delay_s)
            if fault == "short":
                self._send(206 if start else 200, half, extra=extra)
                self.wfile.write(half)
                return
            self._send(206 if start else 200, body, extra=extra)
            if fault in ("truncate", "stall"):
                self.wfile.write(half)
                self.wfile.flush()
                if fault == "stall":
                    state.stop.wait(20)
                self.close_connection = True
                return
            self.wfile.write(body)

    return Handler


@pytest.fixture
def serve_files():
    """serve_files(files, faults=..., delay_s=...) -> a running FaultServer; all stopped at teardown."""
    started: list[tuple[ThreadingHTTPServer, FaultServer]] = []

    def start(files: dict[str, bytes], **kw: object) -> FaultServer:
        state = FaultServer(dict(files), **kw)  # type: ignore[arg-type]
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
        server.daemon_threads = True
        state.url = f"http://127.0.0.1:{server.server_address[1]}/m"
        state.close = lambda: (state.stop.set(), server.shutdown(), server.server_close())
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        started.append((server, state))
        return state

    yield start
    for _server, state in started:
        state.close()


@pytest.fixture
def kit() -> SimpleNamespace:
    """The helpers below, for test modules (conftest is not importable under importlib mode)."""
    return SimpleNamespace(manifest_json=manifest_json, model_files=model_files, with_manifest=with_manifest,
                           write_dir=write_dir)


def manifest_json(files: dict[str, bytes]) -> bytes:
    entries = [FileEntry(p, len(b), "sha256:" + hashlib.sha256(b).hexdigest()) for p, b in files.items()]
    return make_manifest(entries).to_json().encode()


def model_files(seed: int = 0, big: int = 300_000) -> dict[str, bytes]:
    """A small 'model': a config, a nested tokenizer file and a binary shard of `big` bytes."""
    shard = hashlib.shake_256(f"shard{seed}".encode()).digest(big)
    return {"config.json": b'{"seed": %d}' % seed, "tok/tokenizer.json": b"{}" * 50, "model.safetensors": shard}


def with_manifest(files: dict[str, bytes]) -> dict[str, bytes]:
    return {**files, MANIFEST_NAME: manifest_json(files)}


def write_dir(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root
