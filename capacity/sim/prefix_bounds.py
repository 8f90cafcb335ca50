"""What prefix hit rate a trace allows at all: two bounds that any router is measured against.

- Infinite cache: every block ever computed stays cached, anywhere a request can use it. The hit
  rate no cluster exceeds, however many replicas or tiers it has.
- Aggregate LRU: one LRU cache as large as the cluster's caches together (replicas x hashes per
  replica), every request routed to it (perfect affinity, no load balancing to break it). What
  a router reaches if it made the replicas' caches add up.

Same accounting as the simulated engine (capacity/perf/engine_core.py `_admit`): a request looks up
its first `prompt // hash_block_tokens` hashes; its hit is the leading run found, in tokens,
capped one short of the prompt (the engine always computes the last token); the hit rate is hit
tokens over prompt tokens of every request. The LRU refreshes a prompt's hashes last first, so
its head is the newest, as the engine releases them. Concurrency is ignored: the bound has no
running requests pinning blocks, so it can only be higher than a real cache of that size.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from hbmserve.capacity.perf.engine_types import EngineConfig
from hbmserve.capacity.traces.arrivals import Arrivals


@dataclass(frozen=True)
class PrefixBounds:
    prompt_tokens: int
    infinite_hit_rate: float
    lru_hit_rate: float
    lru_capacity_hashes: int  # the aggregate cache the LRU bound assumes

    def to_json_dict(self) -> dict[str, float | int]:
        return {"bound_infinite_hit_rate": self.infinite_hit_rate, "bound_lru_hit_rate": self.lru_hit_rate,
                "bound_lru_capacity_hashes": self.lru_capacity_hashes}


def _usable(hashes: Sequence[int], prompt: int, block_tokens: int) -> Sequence[int]:
    return hashes[:min(len(hashes), prompt // block_tokens)]


def _hit_tokens(run: int, prompt: int, block_tokens: int) -> int:
    return min(run * block_tokens, max(prompt - 1, 0))


def prefix_bounds(arrivals: Arrivals, capacity_hashes: int, block_tokens: int) -> PrefixBounds:
    """Both bounds for `arrivals` (in arrival order), the LRU of `capacity_hashes` hashes."""
    if capacity_hashes < 1 or block_tokens < 1:
        raise ValueError("capacity_hashes and block_tokens must be >= 1")
    if arrivals.hashes is None:
        raise ValueError("the trace has no hash_ids: no prefix bound to compute")
    seen: set[int] = set()
    lru: OrderedDict[int, None] = OrderedDict()
    total = inf_hits = lru_hits = 0
    for prompt, hashes in zip(arrivals.prompt.tolist(), arrivals.hashes):
        total += prompt
        use = _usable(hashes, prompt, block_tokens)
        run = next((i for i, h in enumerate(use) if h not in seen), len(use))
        inf_hits += _hit_tokens(run, prompt, block_tokens)
        seen.update(use)
        run = next((i for i, h in enumerate(use) if h not in lru), len(use))
        lru_hits += _hit_tokens(run, prompt, block_tokens)
        for h in reversed(use):
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > capacity_hashes:
            lru.popitem(last=False)
    rate = (lambda hits: hits / total if total else 0.0)
    return PrefixBounds(total, rate(inf_hits), rate(lru_hits), capacity_hashes)


def cluster_capacity_hashes(engine: EngineConfig, replicas: int) -> int:
    """The hashes `replicas` engines can keep: HBM, or the host tier where it is larger (it is
    write-through, so it already holds what HBM holds)."""
    per = max(engine.num_blocks * engine.block_size, engine.host_kv_tokens) // engine.hash_block_tokens
    return max(1, replicas * per)
