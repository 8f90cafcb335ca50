"""The stages of `decide` (autoscale/stages.py), each on its own, with hand-derived numbers."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.autoscale.policy import PolicyState, decide
from hbmserve.autoscale.stages import (Needs, Signals, Wish, apply_hysteresis, explain, hold_pool,
                                      needs_of, pool_for, read_signals, wish)
from hbmserve.autoscale.warm_pool import PoolHold, PoolSizing
from hbmserve.core.scaling import ReplicaSnapshot, ReplicaState, Snapshot, Tier

CFG = AutoscaleConfig()  # TTFT 2 s, queue 4/replica, 1 rps/replica at 0.8 (down 0.7), cold 180 s


def snap(now: float = 0.0, *, active: int = 0, starting: int = 0, standby: int = 0,
         waiting: int = 0, running: int = 0, kv: float = 0.0, rate: float = 0.0,
         ttft: tuple[float, ...] = (), tpot: tuple[float, ...] = (), pending: int = 0,
         warm_ready: int = 0) -> Snapshot:
    reps = [ReplicaSnapshot(f"a{i}", ReplicaState.ACTIVE, waiting, running, kv)
            for i in range(active)]
    reps += [ReplicaSnapshot(f"s{i}", ReplicaState.STARTING) for i in range(starting)]
    reps += [ReplicaSnapshot(f"h{i}", ReplicaState.STANDBY) for i in range(standby)]
    return Snapshot(now=now, replicas=tuple(reps), ttft_samples_s=ttft, tpot_samples_s=tpot,
                    arrival_rate_rps=rate, pending_at_ingress=pending, warm_ready=warm_ready)


def p95_of(value: float, low: float = 0.1) -> tuple[float, ...]:
    return (low,) * 18 + (value,) * 2  # nearest-rank p95 of 20 samples is the 19th smallest


def signals(config: AutoscaleConfig = CFG, state: PolicyState = PolicyState(),
            **snapshot: object) -> Signals:
    return read_signals(snap(**snapshot), config, state)  # type: ignore[arg-type]


# ---- read_signals ----

def test_current_is_the_last_target_or_else_what_runs():
    s = signals(active=2, starting=1, standby=1, waiting=3, running=1)
    assert s.current == 3  # 2 active + 1 starting; the standby is not counted
    assert signals(state=PolicyState(target_active=5), active=2).current == 5
    assert (s.load.active, s.load.waiting, s.load.running, s.load.in_flight) == (2, 6, 2, 8)


def test_floor_is_min_replicas_or_one_for_requests_held_at_the_ingress():
    zero_min = replace(CFG, min_replicas=0)
    assert signals(zero_min).floor == 0
    assert signals(zero_min, pending=2).floor == 1
    assert signals(replace(CFG, min_replicas=3), pending=2).floor == 3


def test_idle_means_nothing_in_flight_and_nothing_arriving():
    assert signals(active=2).idle
    assert not signals(active=2, rate=0.1).idle
    assert not signals(active=2, running=1).idle
    assert not signals(pending=1).idle


def test_p95s_need_min_latency_samples_and_tpot_a_target():
    few = signals(active=1, ttft=(9.0,) * (CFG.min_latency_samples - 1))
    assert few.ttft_p95_s is None and few.ttft_samples == 4
    s = signals(active=1, ttft=p95_of(3.0), tpot=p95_of(0.2))
    assert s.ttft_p95_s == 3.0 and s.ttft_samples == 20
    assert s.tpot_p95_s is None  # CFG has no TPOT target: samples or not, no signal
    with_tpot = signals(replace(CFG, tpot_p95_target_s=0.1), active=1, tpot=p95_of(0.2))
    assert with_tpot.tpot_p95_s == 0.2 and with_tpot.tpot_samples == 20


def test_blind_until_the_new_replicas_can_show_then_not():
    state = PolicyState(latency_blind_until=10.0)
    assert signals(state=state, now=9.9, active=1).blind
    assert not signals(state=state, now=10.0, active=1).blind


def test_a_queue_over_target_echoes_for_one_look_back_window():
    over = signals(now=100.0, active=2, waiting=5)  # 10 queued > 4 x 2
    assert over.queue_over_at == 100.0 and over.echo and over.muted
    at_target = signals(now=100.0, active=2, waiting=4)  # 8 queued is not over 4 x 2
    assert at_target.queue_over_at is None and not at_target.echo
    remembered = PolicyState(queue_over_at=100.0)
    assert signals(state=remembered, now=129.9, active=2).echo  # look_back_s = 30
    assert not signals(state=remembered, now=130.0, active=2).echo


# ---- needs_of ----

def test_a_queue_of_20_on_2_actives_asks_for_the_backlog_left_when_a_cold_start_lands():
    # Excess over target: 20 - 4 x 2 = 12. Help is a cold start (no standby, no warm node),
    # 180 s away; the 2 actives serve 2 rps against 3 arriving, so 12 + (3 - 2) x 180 = 192
    # are left then, to drain within min(120, max(2, 180)) = 120 s on top of the 3 rps:
    # ceil(3 + 192 / 120) = ceil(4.6) = 5.
    n = needs_of(signals(active=2, waiting=10, running=2, rate=3.0), CFG)
    assert n.queue == 5
    # The rate itself: 3 rps at 0.8 rps/replica fits in ceil(3.75) = 4 (no trend yet).
    assert n.rate == 4
    assert (n.ttft, n.tpot, n.ingress) == (0, 0, 0) and n.symptom == 5


def test_a_hot_standby_makes_the_same_queue_ask_for_a_faster_drain():
    # Help 5 s away: 12 + (3 - 2) x 5 = 17 left, to drain within max(2, 5) = 5 s:
    # ceil(3 + 17 / 5) = ceil(6.4) = 7.
    n = needs_of(signals(active=2, standby=1, waiting=10, running=2, rate=3.0), CFG)
    assert n.queue == 7


@pytest.mark.parametrize("p95_s, muted_by, expected", [
    (3.0, None, 6),  # ceil(4 x 3 / 2)
    (10.0, None, 8),  # 4 x 10 / 2 = 20, capped at 4 x max_latency_growth (2)
    (1.9, None, 0),  # on target
    (3.0, "blind", 0),
    (3.0, "echo", 0),
])
def test_ttft_need_is_active_times_p95_over_target_unless_muted(p95_s, muted_by, expected):
    state = {None: PolicyState(), "blind": PolicyState(latency_blind_until=1.0),
             "echo": PolicyState(queue_over_at=0.0)}[muted_by]
    n = needs_of(signals(state=state, active=4, running=1, ttft=p95_of(p95_s)), CFG)
    assert n.ttft == expected


def test_tpot_need_shares_the_growth_cap():
    cfg = replace(CFG, tpot_p95_target_s=0.1, max_latency_growth=1.5)
    n = needs_of(signals(cfg, active=4, running=8, tpot=p95_of(0.125, low=0.03)), cfg)
    assert n.tpot == 5  # ceil(4 x 0.125 / 0.1)
    n = needs_of(signals(cfg, active=4, running=8, tpot=p95_of(0.5, low=0.03)), cfg)
    assert n.tpot == 6  # ceil(4 x 1.5)


def test_requests_held_with_no_active_replica_ask_for_one():
    cfg = replace(CFG, min_replicas=0)
    n = needs_of(signals(cfg, pending=3), cfg)
    assert (n.ingress, n.queue) == (1, 1)  # one replica first, whatever the queue
    assert n.rate == 0  # no arrivals measured yet: the forecast asks for none


def test_an_idle_fleet_has_no_rate_need():
    assert needs_of(signals(active=3), CFG).rate == 0


# ---- wish ----

def needs(rate: int = 0, queue: int = 0, ttft: int = 0, tpot: int = 0, ingress: int = 0) -> Needs:
    return Needs(rate=rate, queue=queue, ttft=ttft, tpot=tpot, ingress=ingress)


def test_up_is_the_highest_need_and_symptom_says_whether_the_forecast_alone_asks():
    s = signals(active=2, running=1, rate=0.5)
    w = wish(needs(rate=4, queue=5), s, CFG)
    assert (w.up, w.symptom) == (5, True)
    w = wish(needs(rate=6, queue=1), s, CFG)
    assert (w.up, w.symptom) == (6, False)  # only the forecast asks for more than 2
    assert wish(needs(rate=40), s, CFG).up == CFG.max_replicas
    assert wish(needs(), replace(s, floor=3), CFG).up == 3


def test_down_is_what_the_rate_fits_in_at_the_downscale_utilization():
    # 3 rps at 0.7 rps/replica: 3 / 0.7 = 4.3, so 5.
    assert wish(needs(), signals(active=8, running=1, rate=3.0), CFG).down == 5
    assert wish(needs(), signals(active=8, running=1, rate=0.2), CFG).down == 1  # never 0 busy
    assert wish(needs(), signals(active=8), CFG).down == 0  # idle


def test_slack_needs_every_symptom_well_under_target():
    cfg = replace(CFG, tpot_p95_target_s=0.1)
    calm = signals(cfg, active=4, waiting=1, running=2, kv=0.5, rate=1.0, ttft=p95_of(1.6),
                   tpot=p95_of(0.08, low=0.03))
    assert wish(needs(), calm, cfg).slack  # queue 1 <= 4 x 0.25, TTFT 1.6 <= 0.8 x 2, ...
    for too_much in (dict(waiting=2),  # 2 per replica > 1
                     dict(ttft=p95_of(1.7)),  # > 1.6
                     dict(tpot=p95_of(0.09, low=0.03)),  # > 0.08
                     dict(kv=0.81),
                     dict(pending=1)):
        kwargs = dict(active=4, waiting=1, running=2, kv=0.5, rate=1.0, ttft=p95_of(1.6),
                      tpot=p95_of(0.08, low=0.03)) | too_much
        assert not wish(needs(), signals(cfg, **kwargs), cfg).slack, too_much


# ---- apply_hysteresis ----

def at(now: float, current: int, rate: float = 0.5, **fields: object) -> Signals:
    return replace(signals(now=now, active=current, running=1 if rate else 0, rate=rate),
                   current=current, **fields)


def test_a_target_over_max_replicas_comes_down_at_once():
    cfg = replace(CFG, max_replicas=6)
    state = PolicyState(target_active=10, up_since=1.0, latency_blind_until=99.0)
    out = apply_hysteresis(Wish(up=6, down=1, slack=True, symptom=True), at(5.0, 10), state, cfg)
    assert (out.target, out.action) == (6, "down 10→6 (max_replicas)")
    assert out.state.last_scale_down_at == 5.0 and out.state.up_since is None
    assert out.state.latency_blind_until == 99.0  # untouched


@pytest.mark.parametrize("symptom, delay", [(True, 5.0), (False, 30.0)])
def test_an_up_wish_waits_for_its_delay_then_blinds_the_latencies(symptom, delay):
    up = Wish(up=4, down=1, slack=False, symptom=symptom)
    state = PolicyState(target_active=2)
    out = apply_hysteresis(up, at(0.0, 2), state, CFG)
    assert out.target == 2 and out.state.up_since == 0.0
    out = apply_hysteresis(up, at(delay - 0.1, 2), out.state, CFG)
    assert out.target == 2 and f"up to 4 pending ({delay - 0.1:.1f}/{delay:g}s)" in out.action
    out = apply_hysteresis(up, at(delay, 2), out.state, CFG)
    assert out.target == 4 and out.action == "up 2→4 (2 cold)"
    assert out.state.up_since is None and out.state.last_scale_up_at == delay
    # Cold replicas arrive after 180 s; their requests fill a 30 s window after that.
    assert out.state.latency_blind_until == delay + 180.0 + 30.0


def test_below_the_floor_is_an_up_wish_acted_on_at_once():
    cfg = replace(CFG, min_replicas=0, upscale_delay_s=60.0)
    s = replace(signals(cfg, now=0.0, pending=3), current=0)
    out = apply_hysteresis(Wish(up=1, down=0, slack=False, symptom=True), s,
                           PolicyState(target_active=0), cfg)
    assert out.target == 1
    assert out.action == "up 0→1 (1 cold) from zero: requests held at the ingress"


def test_a_promotion_blinds_the_latencies_only_for_a_hot_start():
    s = at(0.0, 2, load=replace(signals(active=2).load, standby=1))
    out = apply_hysteresis(Wish(up=3, down=1, slack=False, symptom=True), s, PolicyState(),
                           replace(CFG, upscale_delay_s=0.0))
    assert out.action == "up 2→3 (1 hot)" and out.state.latency_blind_until == 5.0 + 30.0


def test_a_down_wish_applies_the_highest_need_seen_while_it_waited():
    cfg = replace(CFG, downscale_delay_s=60.0)
    state = PolicyState(target_active=6)
    for now, down in ((0.0, 1), (30.0, 3), (59.0, 1)):
        out = apply_hysteresis(Wish(up=1, down=down, slack=True, symptom=False), at(now, 6),
                               state, cfg)
        state = out.state
        assert out.target == 6 and state.down_since == 0.0
    assert state.down_floor == 3 and "down to 3 pending (59/60s)" in out.action
    out = apply_hysteresis(Wish(up=1, down=1, slack=True, symptom=False), at(60.0, 6), state, cfg)
    assert (out.target, out.action) == (3, "down 6→3 (slack for 60s)")
    assert (out.state.down_since, out.state.down_floor, out.state.last_scale_down_at) == \
        (None, 0, 60.0)


def test_no_scale_down_within_the_cool_down_of_a_scale_up():
    cfg = replace(CFG, downscale_delay_s=0.0, downscale_cooldown_s=60.0)
    state = PolicyState(target_active=6, last_scale_up_at=20.0)
    down = Wish(up=1, down=2, slack=True, symptom=False)
    out = apply_hysteresis(down, at(79.0, 6), state, cfg)
    assert out.target == 6 and "(cool-down after scale-up)" in out.action
    assert apply_hysteresis(down, at(80.0, 6), state, cfg).target == 2


def test_no_scale_down_cancels_the_starts_of_the_last_scale_up():
    # 2 -> 4 at t=0 with two cold starts (180 s): the cool-down (60 s) has long passed at 100 s
    # and the fleet is slack, but the two starts are not cancelled; at 180 s they serve.
    cfg = replace(CFG, upscale_delay_s=0.0, downscale_delay_s=0.0, downscale_cooldown_s=60.0)
    up = apply_hysteresis(Wish(up=4, down=2, slack=False, symptom=True), at(0.0, 2),
                          PolicyState(target_active=2), cfg)
    assert up.target == 4 and up.state.starts_ready_at == 180.0
    down = Wish(up=1, down=2, slack=True, symptom=False)
    held = apply_hysteresis(down, at(100.0, 4), up.state, cfg)
    assert held.target == 4 and "(cool-down after scale-up)" in held.action
    assert apply_hysteresis(down, at(180.0, 4), held.state, cfg).target == 2
    # Promoting hot standbys (5 s) holds a scale-down for the cool-down only.
    up = apply_hysteresis(Wish(up=4, down=2, slack=False, symptom=True),
                          at(0.0, 2, load=replace(at(0.0, 2).load, standby=2)),
                          PolicyState(target_active=2), cfg)
    assert up.state.starts_ready_at == 5.0
    assert apply_hysteresis(down, at(60.0, 4), up.state, cfg).target == 2


def test_scale_to_zero_has_its_own_delay():
    cfg = replace(CFG, min_replicas=0, downscale_delay_s=100.0, scale_to_zero_delay_s=10.0)
    zero = Wish(up=0, down=0, slack=True, symptom=False)
    out = apply_hysteresis(zero, at(0.0, 1, rate=0.0, floor=0), PolicyState(target_active=1), cfg)
    out = apply_hysteresis(zero, at(9.0, 1, rate=0.0, floor=0), out.state, cfg)
    assert out.target == 1 and "down to 0 pending (9/10s)" in out.action
    out = apply_hysteresis(zero, at(10.0, 1, rate=0.0, floor=0), out.state, cfg)
    assert (out.target, out.action) == (0, "down 1→0 (slack for 10s)")


def test_a_scale_down_goes_straight_to_the_need_even_when_the_hot_pool_lacks_standbys():
    """The surplus actives become the hot pool's standbys (demoted, engines loaded), so none
    lingers as active waiting for a pool to be built. Keeping them active deadlocked live
    where active + hot hit max_replicas: the pool could never fill, so it never went down."""
    cfg = replace(CFG, downscale_delay_s=0.0, hot_standby_min=2)
    s = at(0.0, 6)
    assert pool_for(s, cfg, 1).hot == 2 and s.load.standby == 0  # 2 standbys missing
    out = apply_hysteresis(Wish(up=1, down=1, slack=True, symptom=False), s,
                           PolicyState(target_active=6), cfg)
    assert (out.target, out.action) == (1, "down 6→1 (slack for 0s)")
    assert (out.state.down_since, out.state.down_floor, out.state.last_scale_down_at) == (None, 0, 0.0)


def test_a_hold_clears_the_timers_and_keeps_the_rest_of_the_state():
    state = PolicyState(target_active=4, up_since=1.0, down_since=2.0, down_floor=2,
                        last_scale_up_at=0.5, latency_blind_until=50.0)
    out = apply_hysteresis(Wish(up=4, down=4, slack=True, symptom=False), at(3.0, 4), state, CFG)
    assert out.action == "hold 4 (within band)"
    assert out.state == replace(state, up_since=None, down_since=None, down_floor=0,
                                trend=out.state.trend, queue_over_at=None,
                                envelope=out.state.envelope)
    out = apply_hysteresis(Wish(up=4, down=2, slack=False, symptom=False), at(3.0, 4), state, CFG)
    assert out.action == "hold 4 (symptoms not slack)"


# ---- pool_for and explain ----

def test_pool_for_honours_the_bounds_and_the_room_under_max_replicas():
    cfg = replace(CFG, hot_standby_min=1, hot_standby_max=1, max_replicas=4)
    s = signals(cfg, active=2, running=1, rate=1.0)
    assert pool_for(s, cfg, 2).hot == 1
    assert pool_for(s, cfg, 4).hot == 0  # no room left for a standby that could be promoted


def test_hold_pool_orders_after_the_forecast_delay_and_cancels_after_the_scale_down_delay():
    cfg = replace(CFG, max_replicas=10, rate_upscale_delay_s=30.0, downscale_delay_s=60.0,
                  hot_standby_max=4)
    state = PolicyState(pool_hot=PoolHold(0), pool_warm=PoolHold(1))

    def step(now, hot, warm, state, active=2, current=2):
        s = replace(at(now, current), current=current)
        return hold_pool(PoolSizing(hot, warm, "sized"), s, state, cfg, active)

    pool, state = step(0.0, 1, 0, state)  # wants one more hot, one fewer warm: both wait
    assert (pool.hot, pool.warm) == (0, 1) and "held at hot 0, warm 1" in pool.reason
    pool, state = step(29.0, 2, 0, state)
    assert (pool.hot, pool.warm) == (0, 1)
    pool, state = step(30.0, 2, 0, state)  # 30 s up: the lowest count wished meanwhile
    assert (pool.hot, pool.warm) == (1, 1)
    # 60 s down: warm goes. The second hot waits its own 30 s, counted from 60 s, where the
    # wish was first seen above the count the first rise left.
    pool, state = step(60.0, 2, 0, state)
    assert (pool.hot, pool.warm) == (1, 0)
    pool, state = step(90.0, 2, 0, state)
    assert (pool.hot, pool.warm) == (2, 0) and pool.reason == "sized"
    # A scale-down 3 -> 1 releases two replicas: they may join the hot pool at once.
    pool, state = step(91.0, 4, 0, state, active=1, current=3)
    assert pool.hot == 4
    # Bounds and room apply at once: 9 actives leave room for one standby.
    pool, state = step(92.0, 4, 0, state, active=9, current=9)
    assert (pool.hot, pool.warm) == (1, 0)


def test_explain_leads_with_the_action_and_names_each_need_and_the_refill():
    cfg = replace(CFG, hot_standby_min=1)
    s = signals(cfg, active=2, waiting=10, running=2, rate=3.0)
    n = needs_of(s, cfg)
    out = apply_hysteresis(wish(n, s, cfg), s, PolicyState(), replace(cfg, upscale_delay_s=0.0))
    text = explain(out, s, n, pool_for(s, cfg, out.target), cfg)
    assert text.startswith("up 2→5 (3 cold): rate 3.00 rps")
    assert "(need 4 at 0.80 rps/replica)" in text and "queue 10.0/replica vs 4 (need 5)" in text
    assert "no p95 TTFT (need 0)" in text and "TPOT not a signal (need 0)" in text
    assert text.endswith("; refill hot 0→1, warm 0→0")


def test_decide_is_the_stages_in_order():
    sn = snap(0.0, active=2, waiting=10, running=2, rate=3.0)
    d, state = decide(sn, CFG, PolicyState())
    s = read_signals(sn, CFG, PolicyState())
    n = needs_of(s, CFG)
    out = apply_hysteresis(wish(n, s, CFG), s, PolicyState(), CFG)
    pool, held = hold_pool(pool_for(s, CFG, out.target), s, out.state, CFG, out.target)
    assert d.target_active == out.target and state == held
    assert replace(held, pool_hot=None, pool_warm=None) == out.state
    assert d.target_standby == {Tier.HOT: pool.hot, Tier.WARM: pool.warm, Tier.COLD: 0}
    assert d.reason == explain(out, s, n, pool, CFG)
    assert math.isclose(state.trend.level, 3.0)
