"""Prefill/decode disaggregation in the simulator (issue 23): two fixed pools of the engine model,
routed by the same `choose` as the aggregated cluster, with the KV moved between them.

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

Each engine steps one step at a time (a request arriving mid-step joins the next), which keeps
the loop short; the aggregated simulator (cluster_sim.py) coalesces decode steps, so compare the
two on their summaries, not on their run times. Pure apart from CPU time.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from hbmserve.capacity.perf.engine_core import EngineConfig, EngineCore, SimRequest
from hbmserve.capacity.perf.perf_model import Deployment, cost_model, kv_transfer_s
from hbmserve.capacity.sim.metrics import SimSummary, summarize
from hbmserve.capacity.traces.arrivals import Arrivals
from hbmserve.core.config import SloSeconds
from hbmserve.core.routing import ReplicaLoad, RouteRequest, Router
from hbmserve.core.scaling import ReplicaState
from hbmserve.routing.choose import choose


@dataclass(frozen=True)
class Pool:
    deployment: Deployment
    engine: EngineConfig
    replicas: int


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
class DisaggResult:
    summary: SimSummary
    transfer_s: float  # mean KV transfer per request
    transferred_tokens: int
    prefill_busy: float = 0.0  # the share of the prefill pool's replica time spent in steps
    decode_busy: float = 0.0


class _Engine:
    __slots__ = ("rid", "core", "busy_until", "plan")

    def __init__(self, rid: str, core: EngineCore) -> None:
        self.rid, self.core, self.busy_until, self.plan = rid, core, 0.0, None

    def load(self) -> ReplicaLoad:
        return ReplicaLoad(self.rid, ReplicaState.ACTIVE, self.core.num_waiting, self.core.num_running,
                           self.core.kv_usage(), self.core.cache.cached() if self.core.cache else frozenset())


_STEP, _ARRIVE_DECODE = 0, 1


def simulate_disagg(spec: DisaggCluster, arrivals: Arrivals, router: Router = choose,
                    max_drain_s: float = 3600.0) -> DisaggResult:
    """Replay `arrivals` through the two pools."""
    pools = {}
    for name, pool in (("p", spec.prefill), ("d", spec.decode)):
        if pool.replicas < 1:
            raise ValueError(f"the {'prefill' if name == 'p' else 'decode'} pool needs at least one replica")
        cost = cost_model(pool.deployment)
        pools[name] = [_Engine(f"{name}{i}", EngineCore(pool.engine, cost)) for i in range(pool.replicas)]
    heap: list[tuple[float, int, int, object]] = []
    seq = 0
    first = np.full(len(arrivals), np.nan)
    finish = np.full(len(arrivals), np.nan)
    transfer_total, transferred, rejected, preempted = 0.0, 0, 0, 0
    overhead = spec.prefill.deployment.gpu.overheads.request_s

    def push(t: float, kind: int, item: object) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, item))

    def start(e: _Engine, now: float) -> None:
        if e.plan is None:
            e.plan = e.core.plan(max_steps=1)
            if e.plan is not None:
                push(now + e.plan.total_s, _STEP, e)

    def route(pool: list[_Engine], req: SimRequest) -> _Engine:
        if len(pool) == 1:
            return pool[0]
        ask = RouteRequest(req.prompt, req.max_tokens, prefix_hashes=req.hashes, salt=req.rid)
        best = router([e.load() for e in pool], ask).ranked[0]
        return next(e for e in pool if e.rid == best)

    t, p, o, hs = arrivals.t, arrivals.prompt, arrivals.output, arrivals.hashes
    i, n, now = 0, len(arrivals), 0.0
    deadline = (float(t[-1]) if n else 0.0) + max_drain_s
    while i < n or heap:
        t_arr = float(t[i]) + overhead if i < n else math.inf
        if t_arr <= (heap[0][0] if heap else math.inf):
            now = t_arr
            req = SimRequest(i, float(t[i]), int(p[i]), 1, hs[i] if hs is not None else ())
            e = route(pools["p"], req)
            if e.core.add(req):
                start(e, now)
            else:
                rejected += 1
            i += 1
            continue
        now, _, kind, item = heapq.heappop(heap)
        if now > deadline:
            break
        if kind == _ARRIVE_DECODE:
            req = item
            e = route(pools["d"], req)
            if e.core.add(req):
                start(e, now)
            else:
                rejected += 1
            continue
        e = item
        done = e.core.commit(e.plan, 1, now)
        e.plan = None
        for r in done:
            if e.rid.startswith("p"):  # prefill done: its KV goes to a decode replica
                move = kv_transfer_s(spec.prefill.deployment, spec.decode.deployment, r.prompt, spec.link)
                transfer_total += move
                transferred += r.prompt
                dec = SimRequest(r.rid, r.arrival, r.prompt, int(o[r.rid]))
                dec.preloaded = r.prompt
                push(now + move, _ARRIVE_DECODE, dec)
            else:
                first[r.rid], finish[r.rid] = r.first_token_t, r.finish_t
        start(e, now)
    engines = pools["p"] + pools["d"]
    preempted = sum(e.core.preemptions for e in engines)
    ok = ~np.isnan(finish)
    price = spec.usd_per_gpu_hour if spec.usd_per_gpu_hour is not None else spec.prefill.deployment.gpu.usd_per_gpu_hour
    span = max(now, 1e-9)
    summary = summarize(
        arrival=np.asarray(t, np.float64)[ok], first=first[ok], finish=finish[ok], output=np.asarray(o)[ok],
        total_requests=n, rejected=rejected, itl_values=np.zeros(0), itl_weights=np.zeros(0), preemptions=preempted,
        gpu_seconds=span * spec.gpus, usd_per_gpu_hour=price, makespan_s=span,
        replica_seconds=span * (spec.prefill.replicas + spec.decode.replicas),
        peak_replicas=spec.prefill.replicas + spec.decode.replicas, slo_ttft_s=spec.slo.ttft_s,
        slo_tpot_s=spec.slo.tpot_s, prompt_tokens=sum(e.core.prompt_tokens for e in pools["p"]),
        prefix_hit_tokens=sum(e.core.prefix_hit_tokens for e in pools["p"]))
    served = max(1, int(np.count_nonzero(ok)))
    busy = [sum(e.core.busy_s for e in pools[k]) / (span * len(pools[k])) for k in ("p", "d")]
    return DisaggResult(summary, transfer_total / served, transferred, *busy)
