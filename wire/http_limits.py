"""The limits of hbmserve's HTTP listeners (wire/hardened_http.py), apart from the server so that
a module can name them without importing uvicorn (a replica imports its listener lazily)."""

from __future__ import annotations

from dataclasses import dataclass

from hbmserve.core.config import HttpSpec

# How long a refused connection is drained before it is closed (see `_refuse`).
LINGER_S = 1.0


@dataclass(frozen=True)
class HttpLimits:
    header_timeout_s: float = 10.0
    keep_alive_s: int = 5
    max_connections: int | None = 1024  # None: no cap
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    idle_connection_s: float = 2.0

    @classmethod
    def of(cls, http: HttpSpec) -> HttpLimits:
        """The front door's limits from the config's `serve.http`."""
        return cls(header_timeout_s=http.header_timeout_s, keep_alive_s=http.keep_alive_s,
                   max_connections=http.max_connections, max_header_bytes=http.max_header_bytes,
                   max_headers=http.max_headers, idle_connection_s=http.idle_connection_s)
