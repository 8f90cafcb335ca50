"""The cluster simulator: replicas of one engine behind a router, an optional scaling policy,
and a trace of arrivals, all on a virtual clock.

The router is `hbmserve.routing.choose.choose` unless another is passed. It sees each engine's
queue and KV usage as of now, or, with `stats_interval_s` > 0, as of the last refresh at most
that long ago, as the live ingress does (it polls replica stats). What each replica's prefix
cache holds comes from `prefix_source`: EVENTS, the KV index kept from the engines' KV events
(each engine step publishes a batch; `kv_event_lag_s` delays their arrival), as the live door
does when the engines publish them; or ROUTED, the hashes last routed to each replica (as many
as its HBM holds), the approximate fallback. The policy is any
callable `policy(snapshot, state) -> (ScaleDecision, state)` - the very function the live
autoscaler calls (bind its config with functools.partial). Without a policy the replica count
stays fixed.

Replica life cycle: STARTING (start-up delay of its tier) -> ACTIVE -> DRAINING (takes no new
requests, finishes what it holds) -> removed. STANDBY replicas wait at a tier (HOT, WARM) and are
promoted, fastest tier first, when the policy asks for more active replicas. A replica is billed
from the moment its start-up begins until it is removed, standby included. `faults` loses
replicas at given times; their requests go on elsewhere and pay their re-prefill (faults.py).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque
from collections.abc import Mapping

import numpy as np

from hbmserve.autoscale.roles import VictimCandidate, scale_down_victims
from hbmserve.core.scaling import ReplicaSnapshot, ReplicaState, ScaleDecision, Snapshot, Tier
from hbmserve.core.routing import PrefixSource, ReplicaLoad, RouteRequest, Router
from hbmserve.routing.choose import choose

from hbmserve.capacity.traces.arrivals import Arrivals
from hbmserve.capacity.perf.engine_core import EngineCore, SimRequest
from hbmserve.capacity.perf.perf_model import StepCostModel, cost_model
# PolicyBinding, SimCluster and cluster_for are what callers hand `simulate`: importable from here.
from hbmserve.capacity.sim.cluster_parts import PolicyBinding, SimCluster, _Replica, cluster_for  # noqa: F401
from hbmserve.capacity.sim.faults import ReplicaFaults, orphans
from hbmserve.capacity.sim.kv_view import SimKvView
from hbmserve.capacity.sim.metrics import SimResult
from hbmserve.capacity.sim.run_result import result_of

_STEP, _READY, _TICK, _SAMPLE, _FAULT = 0, 1, 2, 3, 4


class _Run:
    def __init__(self, spec: SimCluster, arrivals: Arrivals, policy: PolicyBinding | None,
                 router: Router, sample_s: float, max_drain_s: float, stats_interval_s: float = 0.0,
                 prefix_source: PrefixSource = PrefixSource.EVENTS, kv_event_lag_s: float = 0.0,
                 faults: ReplicaFaults | None = None, doors: int = 1) -> None:
        self.spec, self.arr, self.pb, self.router = spec, arrivals, policy, router
        self.faults = faults
        self.migrated = 0  # requests a lost replica held, moved to another
        self.stats_interval_s = stats_interval_s
        eng = spec.engine
        self.engine_cfg = dataclasses.replace(
            eng, publish_kv_events=prefix_source is PrefixSource.EVENTS and eng.enable_prefix_caching)
        self.kv = SimKvView(prefix_source, kv_event_lag_s, max(1, eng.num_blocks * eng.block_size // eng.hash_block_tokens),
                            doors)
        self.views: dict[int, tuple[list[ReplicaLoad], float]] = {}  # per door: the loads it saw, when
        self.cost: StepCostModel = cost_model(spec.deployment)
        self.host_value = self.cost.host_block_value(spec.engine.hash_block_tokens) if spec.engine.host_kv_tokens else 0.0
        self.overhead = spec.deployment.gpu.overheads.request_s
        self.sample_s, self.max_drain_s = sample_s, max_drain_s
        self.heap: list[tuple[float, int, int, _Replica | None, int]] = []
        self.seq = 0
        self.replicas: list[_Replica] = []  # live (not removed)
        self.all: list[_Replica] = []
        self.active: list[_Replica] = []
        self.pending: deque[SimRequest] = deque()
        self.inflight = 0
        self.rejected = 0
        self.done: list[SimRequest] = []
        self.itl_v: list[np.ndarray] = []
        self.itl_w: list[np.ndarray] = []
        self.tokens_at: list[float] = []
        self.tokens_n: list[int] = []
        self.ttft_window: deque[tuple[float, float]] = deque()
        self.tpot_window: deque[tuple[float, float]] = deque()  # (finish time, TPOT)
        self.series: list[tuple[float, ...]] = []
        self.decisions: list[tuple[float, int, str]] = []
        self.state = policy.initial_state if policy else None
        self.last_target: int | None = None
        self.preemptions_of_removed = 0
        self.cancelled_starts = 0
        self.next_id = 0

    # ---- plumbing ----
    def push(self, t: float, kind: int, rep: _Replica | None = None, epoch: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, rep, epoch))

    def new_replica(self, state: ReplicaState, now: float, ready_at: float, tier: Tier | None = None) -> _Replica:
        rep = _Replica(self.next_id, state, EngineCore(self.engine_cfg, self.cost), now, ready_at, tier)
        self.next_id += 1
        self.replicas.append(rep)
        self.all.append(rep)
        if state is ReplicaState.ACTIVE:
            self.active.append(rep)
        elif state is ReplicaState.STARTING or ready_at > now:
            rep.ready_epoch += 1
            self.push(ready_at, _READY, rep, rep.ready_epoch)
        return rep

    def remove(self, rep: _Replica, now: float) -> None:
        if rep.ordered and not rep.served:
            self.cancelled_starts += 1  # billed from its order, removed before it served
        rep.removed = now
        rep.epoch += 1
        self.replicas.remove(rep)
        if rep in self.active:
            self.active.remove(rep)
        self.preemptions_of_removed += rep.engine.preemptions
        self.kv.forget(rep.rid)

    # ---- requests ----
    def route(self, req: SimRequest, now: float) -> None:
        if not self.active:
            self.pending.append(req)
            return
        if len(self.active) == 1:
            rep = self.active[0]
        else:
            loads = self.router_view(now, req.rid % self.kv.doors)
            ask = RouteRequest(req.prompt, req.max_tokens, prefix_hashes=req.hashes, salt=req.rid,
                               host_block_value=self.host_value, adapter=req.adapter)
            best = self.router(loads, ask).ranked[0]
            rep = next(r for r in self.active if r.rid == best)
        self.kv.routed(rep.rid, req.hashes, req.rid % self.kv.doors)
        if not rep.engine.add(req):
            self.rejected += 1
            self.inflight -= 1
            return
        if rep.plan is None:
            self.start(rep, now)
        elif rep.plan.steps > 1:
            need = rep.plan.steps_done_by(now - rep.plan_start)
            if need < rep.plan.steps:
                p = rep.plan
                p.durations, p.cumulative = p.durations[:need], p.cumulative[:need]
                rep.epoch += 1
                self.push(rep.plan_start + float(p.cumulative[-1]), _STEP, rep, rep.epoch)

    def router_view(self, now: float, door: int = 0) -> list[ReplicaLoad]:
        """The replicas as the front door `door` sees them: load stats up to `stats_interval_s`
        old, cached blocks as its prefix source says."""
        loads, at = self.views.get(door, ([], -math.inf))
        if now < at + self.stats_interval_s and [x.replica_id for x in loads] == [r.rid for r in self.active]:
            return loads
        loads = [self.load_of(r, now, door) for r in self.active]
        self.views[door] = (loads, now)
        return loads

    def load_of(self, r: _Replica, now: float, door: int = 0) -> ReplicaLoad:
        hbm, host = self.kv.sets(r.rid, now, door)
        lora = r.engine.lora  # its registered adapters, as a live replica reports them
        return ReplicaLoad(r.rid, r.state, r.engine.num_waiting, r.engine.num_running, r.engine.kv_usage(),
                           hbm, host, frozenset(lora.host) if lora else frozenset(),
                           lora.cost.max_cpu_loras if lora else 0)

    def start(self, rep: _Replica, now: float) -> None:
        plan = rep.engine.plan()
        self.kv.published(rep.rid, rep.engine.take_kv_events(), now)
        rep.plan = plan
        if plan is None:
            if rep.state is ReplicaState.DRAINING and not rep.engine.has_work():
                self.remove(rep, now)
            return
        rep.plan_start = now
        rep.epoch += 1
        self.push(now + plan.total_s, _STEP, rep, rep.epoch)

    def on_step(self, rep: _Replica, now: float) -> None:
        plan = rep.plan
        assert plan is not None
        finished = rep.engine.commit(plan, plan.steps, now)
        firsts = 0
        for r, _ in plan.chunks:
            if r.first_token_t == now and r.generated == 1:
                firsts += 1
                self.ttft_window.append((now, now - r.arrival))
        if plan.n_dec:
            self.itl_v.append(plan.durations)
            self.itl_w.append(np.full(plan.steps, plan.n_dec))
        self.tokens_at.append(now)
        self.tokens_n.append(plan.n_dec * plan.steps + firsts)
        for r in finished:
            # As sim_metrics counts it: one-token outputs have no TPOT.
            if r.max_tokens > 1:
                self.tpot_window.append((now, (r.finish_t - r.first_token_t) / (r.max_tokens - 1)))
        self.inflight -= len(finished)
        self.done.extend(finished)
        rep.plan = None
        self.start(rep, now)

    def on_fault(self, now: float) -> None:
        """The busiest active replica is lost (faults.py): the steps it finished stand, the one
        under way is lost, and every request it held goes on from another replica."""
        if not self.active:
            return
        rep = max(self.active, key=lambda r: (r.engine.num_running + r.engine.num_waiting, -r.seq))
        plan = rep.plan
        if plan is not None:
            done = int(np.searchsorted(plan.cumulative, now - rep.plan_start, side="right"))
            if done:
                plan.durations, plan.cumulative = plan.durations[:done], plan.cumulative[:done]
                self.on_step(rep, rep.plan_start + float(plan.cumulative[-1]))
        moved = orphans(rep.engine)
        if rep.removed is None:
            self.remove(rep, now)
        self.migrated += len(moved)
        if self.pb is None:
            self.new_replica(ReplicaState.STARTING, now, now + self.faults.restart_s, Tier.COLD).ordered = False
        for r in moved:
            self.route(r, now)

    # ---- policy ----
    def snapshot(self, now: float) -> Snapshot:
        lb = self.pb.lookback_s if self.pb else 30.0
        for window in (self.ttft_window, self.tpot_window):
            while window and window[0][0] < now - lb:
                window.popleft()
        lo, hi = np.searchsorted(self.arr.t, [now - lb, now], side="right")
        # Before the window has filled, the rate over the part seen (at least 1 s): dividing
        # the first seconds' arrivals by the whole window showed a ramp from 0 that no real
        # load had, and the trend ordered a fleet for it.
        seen = min(lb, max(now, 1.0))
        # As the live system reports them: a HOT standby is a STANDBY replica; a WARM standby is a
        # node with weights on NVMe (`warm_ready`), not a replica; standbys still being prepared
        # are not visible yet.
        reps, warm = [], 0
        for r in self.replicas:
            if r.state is ReplicaState.STANDBY:
                if r.ready_at > now:
                    continue
                if r.tier is Tier.WARM:
                    warm += 1
                    continue
            reps.append(ReplicaSnapshot(r.rid, r.state, r.engine.num_waiting, r.engine.num_running,
                                        r.engine.kv_usage()))
        return Snapshot(now=now, replicas=tuple(reps), ttft_samples_s=tuple(s for _, s in self.ttft_window),
                        tpot_samples_s=tuple(s for _, s in self.tpot_window),
                        arrival_rate_rps=(hi - lo) / seen, pending_at_ingress=len(self.pending), warm_ready=warm)

    def on_tick(self, now: float) -> None:
        assert self.pb is not None
        decision, self.state = self.pb.policy(self.snapshot(now), self.state)
        if decision.target_active != self.last_target:
            self.decisions.append((now, decision.target_active, decision.reason))
            self.last_target = decision.target_active
        self.apply(decision, now)

    def apply(self, d: ScaleDecision, now: float) -> None:
        assert self.pb is not None
        startup = self.pb.startup_s
        up = [r for r in self.replicas if r.state in (ReplicaState.ACTIVE, ReplicaState.STARTING)]
        want = max(0, d.target_active)
        if want > len(up):
            self.scale_up(want - len(up), now, startup)
        elif want < len(up):
            hot = sum(1 for r in self.replicas if r.state is ReplicaState.STANDBY and r.tier is Tier.HOT)
            self.scale_down(len(up) - want, now, up, demote=d.target_standby.get(Tier.HOT, 0) - hot)
        for tier, n in d.target_standby.items():
            if tier is Tier.COLD:
                continue  # nothing to keep for a cold tier: it is provisioned on demand
            have = [r for r in self.replicas if r.state is ReplicaState.STANDBY and r.tier is tier]
            for _ in range(max(0, n - len(have))):
                prep = max(0.0, startup[Tier.COLD] - startup[tier])
                self.new_replica(ReplicaState.STANDBY, now, now + prep, tier)
            for r in sorted(have, key=lambda r: -r.created)[: max(0, len(have) - n)]:
                self.retire(r, now)

    def scale_up(self, n: int, now: float, startup: Mapping[Tier, float]) -> None:
        standby = sorted((r for r in self.replicas if r.state is ReplicaState.STANDBY),
                         key=lambda r: (max(r.ready_at, now) + startup[r.tier], r.created))
        for r in standby[:n]:
            r.state = ReplicaState.STARTING
            r.ready_at = max(r.ready_at, now) + startup[r.tier]
            r.ready_epoch += 1
            self.push(r.ready_at, _READY, r, r.ready_epoch)
        for _ in range(n - min(n, len(standby))):
            self.new_replica(ReplicaState.STARTING, now, now + startup[Tier.COLD], Tier.COLD)

    def scale_down(self, n: int, now: float, up: list[_Replica], demote: int) -> None:
        """The rule the live roles demote by (autoscale/roles.py scale_down_victims): starts
        cancelled first, then the least-loaded actives leave, newest first among equals. Up to
        `demote` of them become hot standbys, as live (Serve keeps active + hot running): they
        take no new requests and finish what they hold. The rest drain and are removed."""
        by_id = {r.rid: r for r in up}
        candidates = [VictimCandidate(r.rid, r.engine.num_waiting + r.engine.num_running, r.seq,
                                      serving=r.state is ReplicaState.ACTIVE) for r in up]
        for rid in scale_down_victims(candidates, n):
            r = by_id[rid]
            if r.state is ReplicaState.STARTING:
                self.remove(r, now)
                continue
            self.active.remove(r)
            if demote > 0:
                demote -= 1
                r.state, r.tier = ReplicaState.STANDBY, Tier.HOT
                continue
            self.retire(r, now)

    def retire(self, r: _Replica, now: float) -> None:
        """Out of service: removed now if idle, else drained (a demoted standby can hold work)."""
        r.state = ReplicaState.DRAINING
        if not r.engine.has_work() and r.plan is None:
            self.remove(r, now)

    def on_ready(self, rep: _Replica, now: float) -> None:
        if rep.state is ReplicaState.STARTING:
            rep.state = ReplicaState.ACTIVE
            rep.served = True
            self.active.append(rep)
            while self.pending and self.active:
                self.route(self.pending.popleft(), now)

    def sample(self, now: float) -> None:
        n_by = {s: 0 for s in ReplicaState}
        for r in self.replicas:
            n_by[r.state] += 1
        w = sum(r.engine.num_waiting for r in self.replicas)
        run = sum(r.engine.num_running for r in self.replicas)
        kv = sum(r.engine.kv_usage() for r in self.active) / len(self.active) if self.active else 0.0
        self.series.append((now, n_by[ReplicaState.ACTIVE], n_by[ReplicaState.STARTING],
                            n_by[ReplicaState.STANDBY], n_by[ReplicaState.DRAINING], w, run, kv,
                            len(self.pending) + 0.0))

    # ---- main loop ----
    def run(self) -> float:
        t, p, o = self.arr.t, self.arr.prompt, self.arr.output
        hs = self.arr.hashes
        n = len(t)
        for _ in range(self.spec.replicas):
            self.new_replica(ReplicaState.ACTIVE, 0.0, 0.0).ordered = False
        if self.pb is not None:
            for tier, k in self.pb.initial_standby.items():
                for _ in range(k):
                    self.new_replica(ReplicaState.STANDBY, 0.0, 0.0, tier).ordered = False
            self.push(0.0, _TICK)
        self.push(0.0, _SAMPLE)
        for at in self.faults.at_s if self.faults else ():
            self.push(at, _FAULT)
        deadline = (float(t[-1]) if n else 0.0) + self.max_drain_s
        i, now = 0, 0.0
        while True:
            if i >= n and self.inflight == 0:
                break
            t_arr = float(t[i]) + self.overhead if i < n else math.inf
            t_ev = self.heap[0][0] if self.heap else math.inf
            if t_arr <= t_ev:
                now = t_arr
                self.inflight += 1
                req = SimRequest(i, float(t[i]), int(p[i]), int(o[i]), hs[i] if hs is not None else (),
                                 self.arr.adapter_of(i))
                i += 1
                self.route(req, now)
                continue
            if t_ev > deadline:
                break
            now, _, kind, rep, epoch = heapq.heappop(self.heap)
            if kind == _STEP:
                if rep is not None and rep.epoch == epoch and rep.removed is None:
                    self.on_step(rep, now)
            elif kind == _READY:
                if rep is not None and rep.ready_epoch == epoch and rep.removed is None:
                    self.on_ready(rep, now)
            elif kind == _FAULT:
                self.on_fault(now)
            elif kind == _TICK:
                self.on_tick(now)
                self.push(now + self.pb.interval_s, _TICK)  # type: ignore[union-attr]
            else:
                self.sample(now)
                self.push(now + self.sample_s, _SAMPLE)
        return now


def simulate(spec: SimCluster, arrivals: Arrivals, policy: PolicyBinding | None = None,
             router: Router = choose, sample_s: float = 1.0, max_drain_s: float = 3600.0,
             stats_interval_s: float = 0.0, prefix_source: PrefixSource = PrefixSource.EVENTS,
             kv_event_lag_s: float = 0.0, faults: ReplicaFaults | None = None, doors: int = 1) -> SimResult:
    """Replay `arrivals` through the cluster; pure apart from CPU time (no I/O, no wall clock).
    `faults`: replicas lost during the run (faults.py). `doors`: front doors the requests are
    spread over (request i at door i mod doors); only the ROUTED prefix source tells them apart."""
    run = _Run(spec, arrivals, policy, router, sample_s, max_drain_s, stats_interval_s, prefix_source,
               kv_event_lag_s, faults, doors)
    end = run.run()
    return result_of(run, end)
