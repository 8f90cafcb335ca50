"""The limits of hbmserve's HTTP listeners (deployments/wire/hardened_http.py), apart from the server so that
a module can name them without importing uvicorn (a replica imports its listener lazily)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from hbmserve.core.serve_spec import HttpSpec

# How long a refused connection is drained before it is closed (see `_refuse`).
LINGER_S = 1.0
# What a client over the in-flight cap is told to wait: requests finish in seconds.
OVERLOAD_RETRY_AFTER_S = 1
# Answered whatever the caps: readiness, liveness and the scrape must not starve when the door
# is full, or when the prober's address is (a node's kubelet, a NAT that also carries traffic).
PROBE_PATHS = frozenset({"/health", "/metrics"})
# How long a socket past its address's cap has to send a probe's headers (a prober sends at once).
PROBATION_S = 0.5


@dataclass(frozen=True)
class HttpLimits:
    header_timeout_s: float = 10.0
    keep_alive_s: int = 5
    # Requests being handled at once (headers in, reply not finished), probes apart; past it:
    # 429 + Retry-After. Sockets are not counted: a silent one sends no request.
    max_in_flight: int | None = 1024  # None: no cap
    # Open sockets per client address; past it a new socket gets 429 and is closed.
    max_connections_per_client: int | None = 64  # None: no cap
    trusted_proxies: tuple[str, ...] = ()  # networks whose sockets the per-client cap skips
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    idle_connection_s: float = 2.0

    @classmethod
    def of(cls, http: HttpSpec) -> HttpLimits:
        """The front door's limits from the config's `serve.http`."""
        return cls(header_timeout_s=http.header_timeout_s, keep_alive_s=http.keep_alive_s,
                   max_in_flight=http.max_in_flight, max_connections_per_client=http.max_connections_per_client,
                   trusted_proxies=tuple(str(n) for n in http.trusted_proxies),
                   max_header_bytes=http.max_header_bytes, max_headers=http.max_headers,
                   idle_connection_s=http.idle_connection_s)

    def caps_client(self, address: str | None) -> bool:
        """Whether the per-client socket cap applies to a peer at `address`."""
        if self.max_connections_per_client is None or not address:
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return True  # not an IP (a Unix socket's peer): one client
        return not any(ip in ipaddress.ip_network(n, strict=False) for n in self.trusted_proxies)
