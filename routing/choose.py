"""The request router as a pure function: rank replicas for one request.

Both drivers call `choose`: the simulator (capacity/sim/cluster_sim.py) with loads read from its engines,
the live ingress with the replicas' own stats. Only ACTIVE replicas are eligible; STARTING,
STANDBY and DRAINING ones never receive new requests.

The rule, in three steps:
1. Load. Replicas are ordered by (waiting, running, kv_usage): a queued request delays a first
   token more than a running one. The candidates are the replicas whose requests (waiting +
   running: Ray Serve's queue length, SGLang's router's load) are at most `affinity_slack`
   above the fewest: a cache hit saves one prefill, an overloaded replica costs every request
   in it. 32 (SGLang's router balances past 32-64) did best of 8-64 on the prefix-heavy trace
   (ops/bench/prefix_routing.py); a slack on the queue alone (waiting, as before) did worse,
   because a replica holding a popular system prompt fills its batch long before it queues.
2. Prefix affinity. Among the candidates, the one that would compute the fewest of the
   request's blocks wins; among equals, the least loaded. A replica's score is the leading run
   of the request's block hashes (routing/prefix.py, or the engine's own from the KV index) it
   holds in HBM, plus the run it can continue from its host-memory tier, each of those blocks
   worth `request.host_block_value` of an HBM one (loading it over PCIe costs the rest). A
   session's later turns go where its conversation is cached; a first turn goes to the least
   loaded replica holding its system prompt. A best score under `min_hit_share` of the prompt's
   blocks (0.25) does not pin the request: a chat template or a short preamble that every
   request shares would otherwise keep it on the replicas that served first while others idle.
3. Power-of-two fallback. When no candidate holds enough prefix and there are more than two, take
   two at random and the less loaded wins (Mitzenmacher's power of two choices). Strictly
   least-loaded is better with fresh stats, but the live ingress sees replica stats every
   ~100 ms and every request between two updates sees the same snapshot: least-loaded sends
   all of them to one replica (measured: its TTFT p95 1.6-1.9x with stats up to 0.1 s old).
   Two random choices spread them and still never pick the most loaded. The "random" draw
   mixes `request.salt` (the caller's request counter), so a run replays. Step 2 does not
   randomise: its pool is rarely more than one or two replicas (a system prompt stays where it
   was first sent until the slack spills it), and randomising it measured no different.
   Where the fallback loses (to round robin, on traffic without shared prefixes) is in
   docs/benchmarks.md.

A request naming a LoRA adapter (issue 25) first narrows the replicas to those holding it,
unless each of them has more than `adapter_slack` requests above the least loaded replica: then
loading it elsewhere (tens of ms to seconds) costs less than queueing behind them. A replica that
loads it is one with a free adapter slot if any is near the least loaded, so loading evicts
nothing; otherwise the replica's own LRU evicts an idle one (capacity/perf/lora.py place_adapter). Hot
adapters thus spread over as many replicas as their load needs, cold ones stay on one.

The ranking is the pick first, then every other eligible replica least loaded first: the caller
falls back down the list when the first refuses.

Matching assumes a replica's HBM set is prefix-closed (if it holds hash i it holds hashes
0..i-1), as chained hashes in an LRU that evicts tail blocks first are; so the longest match is
found by binary search, O(log blocks) set lookups per replica. The host run is walked block by
block (only where a replica has a host tier).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set
from dataclasses import replace

from hbmserve.core.routing import ReplicaLoad, RouteDecision, RouteRequest, Router
from hbmserve.core.scaling import ReplicaState

DEFAULT_AFFINITY_SLACK = 32
DEFAULT_MIN_HIT_SHARE = 0.25
DEFAULT_ADAPTER_SLACK = 16
_M64 = (1 << 64) - 1


def load_key(r: ReplicaLoad) -> tuple[int, int, float, str]:
    return (r.waiting, r.running, r.kv_usage, r.replica_id)


def ongoing(r: ReplicaLoad) -> int:
    """Requests in the replica (Ray Serve's queue length, SGLang's load)."""
    return r.waiting + r.running


def active_by_load(replicas: Iterable[ReplicaLoad]) -> list[ReplicaLoad]:
    return sorted((r for r in replicas if r.state is ReplicaState.ACTIVE), key=load_key)


def matched_blocks(hashes: Sequence[int], cached: Set[int]) -> int:
    """Length of the leading run of `hashes` in the prefix-closed set `cached`."""
    lo, hi = 0, len(hashes)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if hashes[mid - 1] in cached:
            lo = mid
        else:
            hi = mid - 1
    return lo


def tiered_blocks(hashes: Sequence[int], hbm: Set[int], host: Set[int]) -> tuple[int, int]:
    """(leading run in HBM, how far the host tier continues it): what an engine with an
    offloading connector finds locally, then loads."""
    m = matched_blocks(hashes, hbm)
    if not host:
        return m, 0
    n = m
    while n < len(hashes) and (hashes[n] in host or hashes[n] in hbm):
        n += 1
    return m, n - m


def mix(salt: int) -> int:
    """splitmix64: a request counter to 64 well-mixed bits (consecutive counters look unrelated)."""
    z = (salt + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def two_choices(n: int, salt: int) -> tuple[int, int]:
    """Two distinct indices in range(n), n >= 2, uniform over pairs for a uniform mix."""
    r = mix(salt)
    i = r % n
    return i, (i + 1 + (r >> 32) % (n - 1)) % n


def adapter_candidates(by_load: list[ReplicaLoad], adapter: str, slack: int) -> tuple[list[ReplicaLoad], str]:
    """The replicas a request for `adapter` may go to (least loaded first), and why."""
    floor = min(ongoing(r) for r in by_load)
    within = [r for r in by_load if ongoing(r) <= floor + slack]
    holders = [r for r in within if adapter in r.adapters]
    if holders:
        return holders, f"adapter {adapter} loaded on {len(holders)}; "
    far = any(adapter in r.adapters for r in by_load)
    why = (f"adapter {adapter} only on replicas over {slack} requests busier" if far
           else f"adapter {adapter} on no replica")
    free = [r for r in within if len(r.adapters) < r.adapter_slots]
    if free:
        return free, f"{why}: load it where a slot is free; "
    return within, f"{why}: load it, evicting an idle one; "


def choose(replicas: Iterable[ReplicaLoad], request: RouteRequest,
           affinity_slack: int = DEFAULT_AFFINITY_SLACK, min_hit_share: float = DEFAULT_MIN_HIT_SHARE,
           adapter_slack: int = DEFAULT_ADAPTER_SLACK) -> RouteDecision:
    fleet = active_by_load(replicas)
    if not fleet:
        return RouteDecision((), "no active replica")
    by_load, adapter_why = fleet, ""
    if request.adapter is not None:
        by_load, adapter_why = adapter_candidates(fleet, request.adapter, adapter_slack)
    hashes = request.prefix_hashes
    floor = min(ongoing(r) for r in by_load)
    near = [r for r in by_load if ongoing(r) <= floor + affinity_slack]
    tiers = [tiered_blocks(hashes, r.cached_prefixes, r.host_prefixes) for r in near]
    scores = [m + request.host_block_value * h for m, h in tiers]
    best = max(scores)
    pool = [r for r, sc in zip(near, scores) if sc == best]  # still least loaded first
    # A prefix worth less than `min_hit_share` of the prompt (a chat template, a one-block
    # preamble every request shares) does not pin the request: held by the replicas that
    # served before, it would keep a new one idle until the slack spills.
    small = 0 < best < min_hit_share * len(hashes)
    if small:
        pool = near
    cached = f"only {best:g}/{len(hashes)} prefix blocks cached" if small else "no prefix cached"
    if best and not small:
        pick = pool[0]
        m, h = tiers[near.index(pick)]
        why = (f"prefix affinity: {pick.replica_id} holds {m}/{len(hashes)} prefix blocks"
               + (f" (+{h} in its host tier)" if h else "")
               + (f", least loaded of the {len(pool)} that do" if len(pool) > 1 else ""))
    elif len(pool) <= 2:
        pick = pool[0]
        why = f"least loaded, {cached}: {pick.replica_id}"
    else:
        i, j = two_choices(len(pool), request.salt)
        pick = pool[min(i, j)]
        why = f"two choices, {cached}: {pick.replica_id} over {pool[max(i, j)].replica_id}"
    far = [r.replica_id for r in by_load if ongoing(r) > floor + affinity_slack
           and matched_blocks(hashes, r.cached_prefixes) > best]  # HBM alone beats the pick
    if far:
        why += f"; longer prefix on {', '.join(far)} skipped: over {affinity_slack} requests more than {floor}"
    return RouteDecision((pick.replica_id, *(r.replica_id for r in fleet if r is not pick)),
                         f"{adapter_why}{why} (waiting {pick.waiting}, running {pick.running}, kv {pick.kv_usage:.0%})")


# A decode replica whose KV cache is this full cannot take a prompt's KV without preempting.
DECODE_KV_FULL = 0.95


def choose_decode(router: Router, replicas: Iterable[ReplicaLoad], request: RouteRequest) -> RouteDecision:
    """Rank a disaggregated model's decode replicas for a request whose prompt's KV comes from a
    prefill replica: by load and KV usage with `router` (no prefix: the KV arrives whole), among
    those with room for it (KV usage under DECODE_KV_FULL). None ranked: run it aggregated."""
    fleet = [r for r in replicas if r.state is ReplicaState.ACTIVE]
    room = [r for r in fleet if r.kv_usage < DECODE_KV_FULL]
    if fleet and not room:
        return RouteDecision((), f"no decode replica has room for the KV (all {len(fleet)} at "
                             f"{DECODE_KV_FULL:.0%}+ KV usage)")
    return router(room, replace(request, prefix_hashes=()))
