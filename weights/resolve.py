"""What a replica calls before its engine starts: the model's source in, a local path out.

    resolved = resolve(model.source, cluster.cache, model=model.name, metrics=metrics)
    engine = start_engine(model=str(resolved.path))   # keep `resolved` (its lease) for the replica's life

A hit costs a manifest request to the source (to learn that the content has not changed) and no
bytes. When the source cannot be reached (no network, HF_HUB_OFFLINE) and this node filled the
model from the same source before, that entry is used and `offline` says so: a warm node keeps
starting replicas through a network outage, which is what it is warm for.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hbmserve.core.cache_spec import WeightCacheSpec
from hbmserve.weights.cache import Acquired, WeightCache
from hbmserve.weights.errors import SourceUnavailable
from hbmserve.weights.cache_metrics import CacheMetrics
from hbmserve.weights.sources import LocalDirSource, SourceOptions, parse_source

# (bytes just written, total bytes of the model); the CLI draws its progress bar from it.
FillProgress = Callable[[int, int], None]


def cache_for(spec: WeightCacheSpec) -> WeightCache:
    """The cache `spec` describes, its root expanded on this node."""
    return WeightCache(Path(os.path.expanduser(spec.root)), spec.max_bytes, spec.min_free_bytes)


@dataclass
class Resolved:
    acquired: Acquired
    source: str
    offline: bool  # the source was unreachable; the entry it filled last on this node was used

    @property
    def path(self) -> Path:
        return self.acquired.path

    @property
    def hit(self) -> bool:
        return self.acquired.hit

    def release(self) -> None:
        """Let the entry be evicted again (the engine no longer reads its files)."""
        self.acquired.release()


def resolve(source: str, spec: WeightCacheSpec, *, model: str | None = None, metrics: CacheMetrics | None = None,
            progress: FillProgress | None = None, opts: SourceOptions = SourceOptions(),
            pin: bool = False) -> Resolved:
    """`source` (a path, URL, Hub id or s3:// URI, as a model's `source` field holds it) as a
    local directory in `spec`'s cache, leased until `release()`. Fills on a miss, once per node;
    `pin` keeps the entry for the warm pool; `metrics` counts the hit or miss under `model`."""
    cache = cache_for(spec)
    src = parse_source(source, opts)
    offline = False
    fingerprint = src.fingerprint() if isinstance(src, LocalDirSource) else None
    try:
        manifest = (fingerprint and cache.known_manifest(src.uri, fingerprint)) or src.manifest()
    except SourceUnavailable as e:
        key = cache.last_key(src.uri)
        if key is None:
            raise SourceUnavailable(f"{e}; and this node's cache ({cache.root}) holds no copy of it") from e
        manifest, offline = cache.manifest_of(key), True
    total = manifest.total_bytes
    got = cache.acquire(src, manifest, (lambda n: progress(n, total)) if progress else lambda _n: None,
                        fingerprint)
    if pin:
        cache.pin(got.key)
    if metrics is not None:
        metrics.record(model or src.uri, got)
    return Resolved(got, src.uri, offline)
