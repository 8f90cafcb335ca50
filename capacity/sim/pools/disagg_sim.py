"""Prefill/decode disaggregation in the simulator (issue 23): two pools of the engine model, routed
by the same `choose` as the aggregated cluster, with the KV moved between them; fixed, or scaled
over time by a scaler in the loop.

A request runs in three phases, as it does behind a disaggregating router (vLLM's connectors and
the `kv_transfer_params` hand-off):
1. prefill: on a prefill replica chosen by `choose` (prefix affinity and load), the whole prompt
   with max_tokens 1; the token it produces is dropped, as the router drops it;
2. transfer: the prompt's KV crosses the link between the pools (perf_model.kv_transfer_s:
   bytes = 2 x layers x KV heads x head dim x tokens x dtype, over NVLink, InfiniBand or host
   memory, from the hardware catalog);
3. decode: on a decode replica chosen by `choose` on load and KV usage (no prefix: the KV
   arrives whole), which computes only the last prompt token for its logits and then decodes.
The client's first token is the decode replica's first; TTFT runs from arrival through all three.

Scaling (`PoolScaling`): every `interval_s` the scaler sees both pools (a PoolsSnapshot, as the
live policy does) and says how many replicas each pool holds, starting ones included. A new
replica serves `startup_s` after its order and bills from the order; a surplus is taken from the
starting ones first, then from the serving ones by roles.scale_down_victims (the live rule), which
drain: routed nothing, they finish what they hold and bill until then. A pool always keeps one
serving replica (a surplus is never taken from the last). Billing is per replica-second of each
pool, at its TP.

Each engine steps one step at a time (a request arriving mid-step joins the next), which keeps
the loop short; the aggregated simulator (cluster_sim.py) coalesces decode steps, so compare the
two on their summaries, not on their run times. Pure apart from CPU time.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hbmserve.autoscale.pools.pools_policy import PoolsSnapshot
from hbmserve.autoscale.roles import VictimCandidate, scale_down_victims
from hbmserve.capacity.perf.engine_core import EngineConfig, EngineCore, SimRequest
from hbmserve.capacity.perf.perf_model import Deployment, cost_model, kv_transfer_s
from hbmserve.capacity.sim.metrics import SimSummary, summarize
from hbmserve.capacity.traces.arrivals import Arrivals
from hbmserve.core.config import SloSeconds
from hbmserve.core.routing import ReplicaLoad, RouteRequest, Router
from hbmserve.core.scaling import ReplicaSnapshot, ReplicaState, Snapshot
from hbmserve.routing.choose import choose


@dataclass(frozen=True)
class Pool:
    deployment: Deployment
    engine: EngineConfig
    replicas: int  # fixed; with scaling, those serving at t=0


@dataclass(frozen=True)
class DisaggCluster:
    prefill: Pool
    decode: Pool
    link: str  # perf_model.KV_LINKS
    slo: SloSeconds = SloSeconds()
    usd_per_gpu_hour: float | None = None  # None: the prefill GPU's catalog price

    @property
    def gpus(self) -> int:
        return sum(p.replicas * p.deployment.num_gpus for p in (self.prefill, self.decode))


@dataclass(frozen=True)
class PoolTargets:
    prefill: int  # replicas to hold, starting ones included
    decode: int
    reason: str = ""


# Called once per interval with both pools' view; keeps its own state between calls.
Scaler = Callable[[PoolsSnapshot], PoolTargets]


@dataclass(frozen=True)
class PoolScaling:
    scaler: Scaler
    startup_s: float = 45.0  # order to serving (a warm node: weights on local NVMe)
    interval_s: float = 1.0
    look_back_s: float = 30.0  # the window of the latency samples and rates the scaler sees


@dataclass(frozen=True)
class DisaggResult:
    summary: SimSummary
    transfer_s: float  # mean KV transfer per request
    transferred_tokens: int
    prefill_busy: float = 0.0  # the share of the prefill pool's replica time spent in steps
    decode_busy: float = 0.0
    prefill_replica_s: float = 0.0  # billed replica-seconds per pool
    decode_replica_s: float = 0.0
    scale_actions: int = 0  # changes of either pool's target
    # (t, prefill held, decode held) at the start, at each change and at the end
    timeline: tuple[tuple[float, int, int], ...] = ()
    last_reason: str = ""


class _Engine:
    __slots__ = ("rid", "core", "plan", "ready_at", "born", "draining")

    def __init__(self, rid: str, core: EngineCore, born: float, ready_at: float) -> None:
        self.rid, self.core, self.plan = rid, core, None
        self.born, self.ready_at, self.draining = born, ready_at, False

    def load(self) -> ReplicaLoad:
        return ReplicaLoad(self.rid, ReplicaState.ACTIVE, self.core.num_waiting, self.core.num_running,
                           self.core.kv_usage(), self.core.cache.cached() if self.core.cache else frozenset())

    def serving(self, now: float) -> bool:
        return self.ready_at <= now and not self.draining


class _Pool:
    """One pool's engines and what it has billed."""

    def __init__(self, name: str, pool: Pool) -> None:
        self.name, self.pool, self.cost = name, pool, cost_model(pool.deployment)
        self.engines: list[_Engine] = []
        self.billed_s = self.busy_s = 0.0
        self.made = self.prompt_tokens = self.prefix_hit_tokens = self.preemptions = 0
        for _ in range(pool.replicas):
            self.add(0.0, 0.0)

    def add(self, now: float, ready_at: float) -> None:
        self.engines.append(_Engine(f"{self.name}{self.made}", EngineCore(self.pool.engine, self.cost), now, ready_at))
        self.made += 1

    def held(self) -> list[_Engine]:
        return [e for e in self.engines if not e.draining]

    def remove(self, e: _Engine, now: float) -> None:
        self.engines.remove(e)
        self._bill(e, now)

    def _bill(self, e: _Engine, now: float) -> None:
        self.billed_s += now - e.born
        self.busy_s += e.core.busy_s
        self.prompt_tokens += e.core.prompt_tokens
        self.prefix_hit_tokens += e.core.prefix_hit_tokens
        self.preemptions += e.core.preemptions

    def close(self, now: float) -> None:
        for e in self.engines:
            self._bill(e, now)

    def snapshot(self, now: float, **signals) -> Snapshot:
        replicas = tuple(
            ReplicaSnapshot(e.rid, ReplicaState.ACTIVE, e.core.num_waiting, e.core.num_running, e.core.kv_usage())
            if e.ready_at <= now else ReplicaSnapshot(e.rid, ReplicaState.STARTING)
            for e in self.engines if not e.draining)
        return Snapshot(now=now, replicas=replicas, **signals)


_STEP, _ARRIVE_DECODE, _DECIDE = 0, 1, 2


def simulate_disagg(spec: DisaggCluster, arrivals: Arrivals, router: Router = choose,
                    max_drain_s: float = 3600.0, scaling: PoolScaling | None = None) -> DisaggResult:
    """Replay `arrivals` through the two pools, fixed or scaled by `scaling`."""
    for label, pool in (("prefill", spec.prefill), ("decode", spec.decode)):
        if pool.replicas < 1:
            raise ValueError(f"the {label} pool needs at least one replica")
    pools = {"p": _Pool("p", spec.prefill), "d": _Pool("d", spec.decode)}
    heap: list[tuple[float, int, int, object]] = []
    seq = 0
    first = np.full(len(arrivals), np.nan)
    finish = np.full(len(arrivals), np.nan)
    transfer_total, transferred, rejected, in_transit = 0.0, 0, 0, 0
    overhead = spec.prefill.deployment.gpu.overheads.request_s
    # The scaler's look-back: (t, prompt) entering prefill, t entering decode, (t, ttft, tpot) done.
    seen_p: deque[tuple[float, int]] = deque()
    seen_d: deque[tuple[float]] = deque()
    done_s: deque[tuple[float, float, float | None]] = deque()
    actions, timeline, reason = 0, [(0.0, spec.prefill.replicas, spec.decode.replicas)], ""

    def push(t: float, kind: int, item: object) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, item))

    def start(e: _Engine, now: float) -> None:
        if e.plan is None:
            e.plan = e.core.plan(max_steps=1)
            if e.plan is not None:
                push(now + e.plan.total_s, _STEP, e)

    def admit(pool: _Pool, req: SimRequest, now: float) -> None:
        nonlocal rejected
        live = [e for e in pool.engines if e.serving(now)]
        e = live[0]
        if len(live) > 1:
            ask = RouteRequest(req.prompt, req.max_tokens, prefix_hashes=req.hashes, salt=req.rid)
            best = router([x.load() for x in live], ask).ranked[0]
            e = next(x for x in live if x.rid == best)
        if e.core.add(req):
            start(e, now)
        else:
            rejected += 1

    def resize(pool: _Pool, target: int, now: float) -> None:
        held = pool.held()
        if target > len(held):
            for _ in range(target - len(held)):
                pool.add(now, now + scaling.startup_s)
            return
        surplus = len(held) - max(1, target)
        for e in sorted((e for e in held if e.ready_at > now), key=lambda e: -e.born)[:surplus]:
            pool.remove(e, now)  # a start not yet serving is cancelled
            surplus -= 1
        serving = [e for e in held if e.ready_at <= now]
        surplus = min(surplus, len(serving) - 1)
        gone = set(scale_down_victims((VictimCandidate(e.rid, e.core.num_waiting + e.core.num_running, e.born)
                                       for e in serving), surplus))
        for e in serving:
            if e.rid in gone:
                e.draining = True
                if e.plan is None and not e.core.has_work():
                    pool.remove(e, now)

    def decide(now: float) -> None:
        nonlocal actions, reason
        window = scaling.look_back_s
        for q in (seen_p, seen_d, done_s):
            while q and q[0][0] < now - window:
                q.popleft()
        span = min(window, max(now, scaling.interval_s))
        view = PoolsSnapshot(
            pools["p"].snapshot(now, ttft_samples_s=tuple(s[1] for s in done_s), arrival_rate_rps=len(seen_p) / span),
            pools["d"].snapshot(now, tpot_samples_s=tuple(s[2] for s in done_s if s[2] is not None),
                                arrival_rate_rps=len(seen_d) / span),
            prompt_backlog_tokens=sum(r.prompt - r.computed for e in pools["p"].engines for r in e.core.waiting),
            prompt_tokens_rps=sum(p for _, p in seen_p) / span)
        targets = scaling.scaler(view)
        reason = targets.reason
        before = (len(pools["p"].held()), len(pools["d"].held()))
        for pool, target in ((pools["p"], targets.prefill), (pools["d"], targets.decode)):
            resize(pool, target, now)
        after = (len(pools["p"].held()), len(pools["d"].held()))
        if after != before:
            actions += (after[0] != before[0]) + (after[1] != before[1])
            timeline.append((now, *after))

    t, p, o, hs = arrivals.t, arrivals.prompt, arrivals.output, arrivals.hashes
    i, n, now = 0, len(arrivals), 0.0
    deadline = (float(t[-1]) if n else 0.0) + max_drain_s
    if scaling is not None:
        push(scaling.interval_s, _DECIDE, None)
    while i < n or heap:
        t_arr = float(t[i]) + overhead if i < n else math.inf
        if t_arr <= (heap[0][0] if heap else math.inf):
            now = t_arr
            seen_p.append((now, int(p[i])))
            admit(pools["p"], SimRequest(i, float(t[i]), int(p[i]), 1, hs[i] if hs is not None else ()), now)
            i += 1
            continue
        now, _, kind, item = heapq.heappop(heap)
        if now > deadline:
            break
        if kind == _DECIDE:
            decide(now)
            busy = in_transit or any(e.plan is not None for pool in pools.values() for e in pool.engines)
            if i < n or busy:
                push(now + scaling.interval_s, _DECIDE, None)
            continue
        if kind == _ARRIVE_DECODE:
            in_transit -= 1
            seen_d.append((now,))
            admit(pools["d"], item, now)
            continue
        e = item
        pool = pools[e.rid[0]]
        done = e.core.commit(e.plan, 1, now)
        e.plan = None
        for r in done:
            if pool.name == "p":  # prefill done: its KV goes to a decode replica
                move = kv_transfer_s(spec.prefill.deployment, spec.decode.deployment, r.prompt, spec.link)
                transfer_total += move
                transferred += r.prompt
                dec = SimRequest(r.rid, r.arrival, r.prompt, int(o[r.rid]))
                dec.preloaded = r.prompt
                in_transit += 1
                push(now + move, _ARRIVE_DECODE, dec)
            else:
                first[r.rid], finish[r.rid] = r.first_token_t, r.finish_t
                out = int(o[r.rid])
                done_s.append((now, r.first_token_t - r.arrival,
                               (r.finish_t - r.first_token_t) / (out - 1) if out > 1 else None))
        start(e, now)
        if e.draining and e.plan is None and not e.core.has_work():
            pool.remove(e, now)
    for pool in pools.values():
        pool.close(now)
    pre, dec = pools["p"], pools["d"]
    timeline.append((now, len(pre.held()), len(dec.held())))
    ok = ~np.isnan(finish)
    price = spec.usd_per_gpu_hour if spec.usd_per_gpu_hour is not None else spec.prefill.deployment.gpu.usd_per_gpu_hour
    span = max(now, 1e-9)
    gpu_s = pre.billed_s * spec.prefill.deployment.num_gpus + dec.billed_s * spec.decode.deployment.num_gpus
    peak = max(a + b for _, a, b in timeline)
    summary = summarize(
        arrival=np.asarray(t, np.float64)[ok], first=first[ok], finish=finish[ok], output=np.asarray(o)[ok],
        total_requests=n, rejected=rejected, itl_values=np.zeros(0), itl_weights=np.zeros(0),
        preemptions=pre.preemptions + dec.preemptions, gpu_seconds=gpu_s, usd_per_gpu_hour=price, makespan_s=span,
        replica_seconds=pre.billed_s + dec.billed_s, peak_replicas=peak, slo_ttft_s=spec.slo.ttft_s,
        slo_tpot_s=spec.slo.tpot_s, prompt_tokens=pre.prompt_tokens, prefix_hit_tokens=pre.prefix_hit_tokens)
    served = max(1, int(np.count_nonzero(ok)))
    return DisaggResult(summary, transfer_total / served, transferred,
                        pre.busy_s / max(pre.billed_s, 1e-9), dec.busy_s / max(dec.billed_s, 1e-9),
                        pre.billed_s, dec.billed_s, actions, tuple(timeline), reason)
