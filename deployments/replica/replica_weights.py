"""A replica's weights, made local through the node's weight cache before its engine starts.

The model's `source` (a path, URL, Hub id or s3:// URI) goes through `weights.resolve`: the
first replica on a node fills the cache (once, however many start together), the next ones hit.
The replica holds the entry's lease for its whole life, so the cache never evicts what an
engine reads. The outcome is exported through Ray's metrics (scraped with Ray's others) and
reported in the replica's `info()` (`hbmserve status`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hbmserve.core.cache_spec import WeightCacheSpec
from hbmserve.core.config import ModelSpec
from hbmserve.weights.resolve import Resolved, resolve


@dataclass
class LocalWeights:
    model: ModelSpec  # the model with `source` (and each adapter's) pointing at its cache entry
    resolved: Resolved  # holds the lease: keep it as long as the engine runs
    seconds: float  # resolve time: a fill from the source on a miss, a check on a hit
    adapters: tuple[Resolved, ...] = ()  # the adapters' leases, held as long as the base's

    def release(self) -> None:
        for r in (self.resolved, *self.adapters):
            r.release()


def local_weights(model: ModelSpec, cache: WeightCacheSpec) -> LocalWeights | None:
    """The model made local on this node, or None for an engine without weights (the simulated
    one, unless `sim.cache_weights`). Blocking (a miss copies the model): call it in a thread.
    Raises a WeightCacheError naming the cause."""
    if not model.reads_weights:
        return None
    started = time.monotonic()
    resolved = resolve(model.source, cache, model=model.name)
    seconds = time.monotonic() - started
    _export(model.name, resolved, seconds)
    # Adapters come through the same cache (a LoRA folder is small: a miss copies megabytes).
    adapters: list[Resolved] = []
    try:
        for a in model.adapters:
            adapters.append(resolve(a.source, cache, model=f"{model.name}/{a.name}"))
    except BaseException:
        for r in (resolved, *adapters):
            r.release()
        raise
    local = model.model_copy(update={"source": str(resolved.path), "adapters": [
        a.model_copy(update={"source": str(r.path)}) for a, r in zip(model.adapters, adapters)]})
    return LocalWeights(local, resolved, seconds, tuple(adapters))


def _export(model: str, resolved: Resolved, seconds: float) -> None:
    from ray.util.metrics import Counter, Gauge

    tags = {"model": model}
    outcome = "hbmserve_weight_cache_hits" if resolved.hit else "hbmserve_weight_cache_misses"
    Counter(outcome, "Replica starts whose weights were (hits) or were not (misses) in the node's cache",
            tag_keys=("model",)).inc(1, tags)
    if not resolved.hit and resolved.acquired.bytes_fetched:
        Counter("hbmserve_weight_cache_fetched_bytes", "Bytes replicas fetched from sources into the cache",
                tag_keys=("model",)).inc(resolved.acquired.bytes_fetched, tags)
        Gauge("hbmserve_weight_cache_last_fetch_gbps", "GB/s (1e9 bytes) of the model's last fill on a node",
              tag_keys=("model",)).set(resolved.acquired.bytes_fetched / max(seconds, 1e-9) / 1e9, tags)
