"""The TPOT signal: from the simulated replicas' finished requests to hbmserve's `decide`."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.autoscale.policy import PolicyState, decide
from hbmserve.core.scaling import ReplicaSnapshot, ReplicaState, ScaleDecision, Snapshot, Tier
from hbmserve.capacity.traces.arrivals import Arrivals
from hbmserve.capacity.sim.cluster_sim import PolicyBinding, SimCluster, simulate
from hbmserve.core.config import SloSeconds
from hbmserve.capacity.perf.engine_core import EngineConfig
from hbmserve.capacity.perf.hardware import get_gpu
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment

TPOT = AutoscaleConfig(upscale_delay_s=0.0, rate_upscale_delay_s=0.0, tpot_p95_target_s=0.1)


def snap(now: float, *, active: int, tpot: tuple[float, ...] = (), waiting: int = 0,
         running: int = 8, rate: float = 0.5, ttft: tuple[float, ...] = ()) -> Snapshot:
    reps = tuple(ReplicaSnapshot(f"a{i}", ReplicaState.ACTIVE, waiting, running, 0.2)
                 for i in range(active))
    return Snapshot(now=now, replicas=reps, ttft_samples_s=ttft, tpot_samples_s=tpot,
                    arrival_rate_rps=rate)


def with_p95(p95_s: float, low: float = 0.03) -> tuple[float, ...]:
    return (low,) * 18 + (p95_s,) * 2  # nearest-rank p95 of 20 is the 19th smallest


@pytest.mark.parametrize("p95_s, expected", [(0.15, math.ceil(4 * 0.15 / 0.1)),  # 6
                                             (0.125, math.ceil(4 * 0.125 / 0.1)),  # 5
                                             (0.5, math.ceil(4 * 2.0))])  # growth capped: 8
def test_tpot_over_target_asks_for_active_times_p95_over_target(p95_s, expected):
    # 4 replicas at 0.5 rps (rate need 1): only the TPOT need can ask for more.
    d, s = decide(snap(0.0, active=4, tpot=with_p95(p95_s)), TPOT, PolicyState())
    assert d.target_active == expected
    assert f"p95 TPOT {1000 * p95_s:.0f}ms/100ms" in d.reason and f"(need {expected})" in d.reason
    assert s.last_scale_up_at == 0.0


def test_tpot_over_target_waits_for_the_symptom_delay_not_the_rate_delay():
    cfg = dataclasses.replace(TPOT, upscale_delay_s=5.0, rate_upscale_delay_s=30.0)
    s = PolicyState()
    for t in (0.0, 4.0):
        d, s = decide(snap(t, active=4, tpot=with_p95(0.15)), cfg, s)
        assert d.target_active == 4, d.reason
    d, _ = decide(snap(5.0, active=4, tpot=with_p95(0.15)), cfg, s)
    assert d.target_active == 6


def test_without_a_tpot_target_the_samples_change_nothing():
    cfg = dataclasses.replace(TPOT, tpot_p95_target_s=None)
    slow = with_p95(0.5)
    d, _ = decide(snap(0.0, active=4, tpot=slow), cfg, PolicyState())
    d0, _ = decide(snap(0.0, active=4), cfg, PolicyState())
    assert d.target_active == d0.target_active == 4
    assert "TPOT not a signal" in d.reason
    # and a slow TPOT does not block a scale-down either: idle-ish fleet shrinks after the delay
    s = PolicyState()
    for t in range(0, 61):
        d, s = decide(snap(float(t), active=4, running=1, rate=0.5, tpot=slow), cfg, s)
    assert d.target_active == 1


def test_too_few_samples_are_no_signal():
    few = (0.5,) * (TPOT.min_latency_samples - 1)
    d, _ = decide(snap(0.0, active=4, tpot=few), TPOT, PolicyState())
    assert d.target_active == 4 and "no p95 TPOT" in d.reason


def _down_run(tpot: tuple[float, ...], seconds: int = 61) -> ScaleDecision:
    s, d = PolicyState(), None
    for t in range(seconds):
        d, s = decide(snap(float(t), active=4, running=1, rate=0.5, tpot=tpot), TPOT, s)
    assert d is not None
    return d


def test_tpot_well_under_target_lets_the_fleet_shrink():
    # 0.5 rps needs ceil(0.5 / (1.0 x 0.7)) = 1 replica; TPOT 30 ms <= 0.8 x 100 ms.
    d = _down_run(with_p95(0.03))
    assert d.target_active == 1 and "down 4→1" in d.reason


def test_tpot_under_target_but_not_well_under_holds_the_fleet():
    # 90 ms: within the SLO, but over tpot_down_fraction (0.8) of it: no slack to shed replicas.
    d = _down_run(with_p95(0.09))
    assert d.target_active == 4 and "symptoms not slack" in d.reason


def test_tpot_ignored_until_new_replicas_can_show_in_the_window():
    d, s = decide(snap(0.0, active=4, tpot=with_p95(0.15)), TPOT, PolicyState())
    assert d.target_active == 6  # two cold replicas
    blind_until = TPOT.startup_cold_s + TPOT.look_back_s
    assert s.latency_blind_until == blind_until
    slow = with_p95(0.3)
    d, s = decide(snap(100.0, active=6, tpot=slow), TPOT, s)
    assert d.target_active == 6 and "ignored" in d.reason
    d, _ = decide(snap(blind_until, active=6, tpot=slow), TPOT, s)
    assert d.target_active == min(16, math.ceil(6 * 2.0))  # 6 x 0.3 / 0.1 = 18, capped at 2x


def test_tpot_echo_of_a_queue_is_left_to_the_queue_need():
    # 4 x 4 queued is at target: no queue need. One more second with the queue over, then the
    # TPOT of requests that ran in the full batches is ignored for one look-back window.
    s = PolicyState()
    d, s = decide(snap(0.0, active=4, waiting=5, running=20, rate=0.5), TPOT, s)
    d, s = decide(snap(1.0, active=4, tpot=with_p95(0.15)), TPOT, s)
    assert d.target_active == 4
    d, _ = decide(snap(TPOT.look_back_s, active=4, tpot=with_p95(0.15)), TPOT, s)
    assert d.target_active == 6


def test_config_rejects_a_non_positive_tpot_target():
    with pytest.raises(ValueError, match="tpot_p95_target_s"):
        AutoscaleConfig(tpot_p95_target_s=0.0)


def test_from_spec_takes_the_tpot_target_from_the_model_slo():
    from hbmserve.autoscale.policy_config import autoscale_config_for
    from hbmserve.core.config import parse_cluster_spec

    spec = parse_cluster_spec({"models": [{
        "name": "m", "source": "/m", "engine": "sim", "slo": {"tpot_p95_ms": 80},
        "autoscaling": {"min_replicas": 1, "max_replicas": 4},
    }]})
    c = autoscale_config_for(spec.models[0])
    assert c is not None and c.tpot_p95_target_s == pytest.approx(0.08)


def test_the_simulator_reports_each_finished_requests_tpot_in_the_window():
    dep = Deployment(load_model_shape("llama-3.1-8b"), get_gpu("h100-sxm"), tp=2)
    eng = EngineConfig(num_blocks=20_000, max_num_seqs=64, max_num_batched_tokens=2048,
                       max_model_len=4096)
    # One 40-token answer and one 1-token answer (which has no TPOT).
    arr = Arrivals(np.array([1.0, 1.5]), np.array([200, 300]), np.array([40, 1]))
    seen: list[Snapshot] = []

    def spy(snapshot: Snapshot, state):
        seen.append(snapshot)
        return ScaleDecision(1, {}, "spy"), state

    res = simulate(SimCluster(dep, eng, 1, SloSeconds(2.0, 0.1)), arr,
                   PolicyBinding(spy, None, 0.25, 30.0, {Tier.HOT: 5.0, Tier.WARM: 60.0,
                                                         Tier.COLD: 600.0}))
    assert res.summary.finished == 2
    with_samples = [s for s in seen if s.tpot_samples_s]
    assert with_samples, "no snapshot carried a TPOT sample"
    # sim_metrics' own per-request TPOT: (finish - first token) / (output - 1); one request has one.
    expected = res.summary.tpot.p50
    assert all(s.tpot_samples_s == pytest.approx((expected,)) for s in with_samples)
    assert 0 < expected < 0.1
    before = [s for s in seen if not s.tpot_samples_s]
    assert before and before[0].now < with_samples[0].now


def test_the_simulators_rate_before_its_window_fills_is_over_the_part_seen():
    dep = Deployment(load_model_shape("llama-3.1-8b"), get_gpu("h100-sxm"), tp=2)
    eng = EngineConfig(num_blocks=20_000, max_num_seqs=64, max_num_batched_tokens=2048,
                       max_model_len=4096)
    t = np.arange(1, 81) * 0.5  # 2 req/s from t = 0.5 s to 40 s
    arr = Arrivals(t, np.full(80, 100), np.full(80, 5))
    seen: dict[float, float] = {}

    def spy(snapshot: Snapshot, state):
        seen[snapshot.now] = snapshot.arrival_rate_rps
        return ScaleDecision(1, {}, "spy"), state

    simulate(SimCluster(dep, eng, 1, SloSeconds(2.0, 0.1)), arr,
             PolicyBinding(spy, None, 1.0, 30.0, {Tier.HOT: 5.0, Tier.WARM: 60.0,
                                                  Tier.COLD: 600.0}))
    # 10 s in: 20 arrivals over the 10 s seen (not over the 30 s window: 0.67 req/s).
    assert seen[10.0] == pytest.approx(20 / 10)
    # 35 s in: the full window (5, 35] holds 60 arrivals.
    assert seen[35.0] == pytest.approx(60 / 30)


def test_a_tpot_target_below_the_replicas_floor_is_not_chased():
    # One sequence decoding alone takes 0.12 s with these engine settings: no replica count meets
    # 0.1 s, so a p95 of 0.15 s asks for no replicas (it asked for 6 above) and the reason says why.
    stuck = dataclasses.replace(TPOT, tpot_floor_s=0.12)
    d, _ = decide(snap(0.0, active=4, tpot=with_p95(0.15)), stuck, PolicyState())
    assert d.target_active == 4 and "(need 0)" in d.reason
    assert "not chased: one sequence alone decodes at 120ms" in d.reason
    # A floor under the target leaves the signal as it was.
    d, _ = decide(snap(0.0, active=4, tpot=with_p95(0.15)), dataclasses.replace(TPOT, tpot_floor_s=0.02),
                  PolicyState())
    assert d.target_active == 6 and "not chased" not in d.reason
