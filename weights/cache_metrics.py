"""The cache's Prometheus metrics, registered into the registry the caller owns (no module-level
metric objects: two caches in one process, or a test, each get their own)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from hbmserve.weights.cache import Acquired


class CacheMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        label = ["model"]
        self.hits = Counter("hbmserve_weight_cache_hits", "Resolves served from the node's cache",
                            label, registry=registry)
        self.misses = Counter("hbmserve_weight_cache_misses", "Resolves that filled the cache from the source",
                              label, registry=registry)
        self.fetched_bytes = Counter("hbmserve_weight_cache_fetched_bytes", "Bytes fetched from sources",
                                     label, registry=registry)
        # rate(fetched_bytes) / rate(fetch_seconds) is the fill bandwidth over any window.
        self.fetch_seconds = Counter("hbmserve_weight_cache_fetch_seconds", "Seconds spent filling",
                                     label, registry=registry)
        self.last_fetch_gbps = Gauge("hbmserve_weight_cache_last_fetch_gbps",
                                     "GB/s (1e9 bytes) of the model's last fill", label, registry=registry)

    def record(self, model: str, got: Acquired) -> None:
        if got.hit:
            self.hits.labels(model).inc()
            return
        self.misses.labels(model).inc()
        self.fetched_bytes.labels(model).inc(got.bytes_fetched)
        self.fetch_seconds.labels(model).inc(got.seconds)
        if got.seconds > 0:
            self.last_fetch_gbps.labels(model).set(got.bytes_fetched / got.seconds / 1e9)
