"""The autoscaler evaluation harness: trace scaling, static-peak sizing, request accounting,
scale-action counting and determinism, on short traces through the real simulator."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hbmserve.capacity.traces.burst_trace import BurstSpec, burst_arrivals, burst_schedule
from hbmserve.capacity.sim.evaluate import (
    EvalError,
    TraceScaling,
    count_scale_actions,
    evaluate,
    load_eval_cluster,
    scale_trace,
)
from hbmserve.autoscale.registry import POLICIES
from hbmserve.capacity.traces.arrivals import Arrivals

POLICY_NAMES = tuple(POLICIES)


@pytest.fixture(scope="module")
def cluster():
    return load_eval_cluster()


def steps(counts_per_minute: list[int], prompt: int = 800, output: int = 100) -> Arrivals:
    """Evenly spaced arrivals, `counts_per_minute[i]` of them in minute i."""
    t = np.concatenate([np.linspace(60 * i, 60 * (i + 1), n, endpoint=False)
                        for i, n in enumerate(counts_per_minute)])
    return Arrivals(t, np.full(len(t), prompt, dtype=np.int64),
                    np.full(len(t), output, dtype=np.int64))


def test_reference_cluster_is_the_issue_s():
    c = load_eval_cluster()
    dep = c.scenario.deployment
    assert (dep.gpu.name, dep.tp, dep.model.name) == ("h100-sxm", 4, "llama-3.1-70b")
    a = c.model.autoscaling
    assert (a.min_replicas, a.max_replicas) == (1, 16)
    assert (c.scenario.slo_ttft_s, c.scenario.slo_tpot_s) == (2.0, 0.1)
    assert (a.startup_s.hot, a.startup_s.warm, a.startup_s.cold) == (5.0, 45.0, 180.0)
    # The pools the evaluation has always let hbmserve keep (docs/benchmarks.md figures).
    assert (a.hot_standby.max, a.warm_pool.max) == (2, 4)


def test_scale_trace_time_then_tokens_then_clip():
    arr = Arrivals(np.array([0.0, 10.0, 30.0, 50.0]), np.array([100, 3, 7, 1]),
                   np.array([10, 1, 2, 5]))
    out = scale_trace(arr, TraceScaling(time_scale=0.5, token_scale=1.5, clip_s=20.0))
    # times halve to 0, 5, 15, 25; the last is past the 20 s clip
    assert out.t.tolist() == [0.0, 5.0, 15.0]
    assert out.prompt.tolist() == [150, round(4.5), round(10.5)]  # numpy rounds half to even
    assert out.output.tolist() == [15, 2, 3]  # 1.5 -> 2 (even), 3
    assert min(scale_trace(arr, TraceScaling(token_scale=0.01)).output) == 1  # never 0 tokens


@pytest.mark.parametrize("kwargs, flag", [({"time_scale": 0}, "--time-scale"),
                                          ({"token_scale": -1}, "--token-scale"),
                                          ({"clip_s": 0}, "--clip")])
def test_trace_scaling_rejects_non_positive(kwargs, flag):
    with pytest.raises(EvalError, match=flag):
        TraceScaling(**kwargs)


def test_clip_before_the_first_request_is_an_error():
    arr = Arrivals(np.array([5.0, 6.0]), np.array([1, 1]), np.array([1, 1]))
    with pytest.raises(EvalError, match="no request"):
        scale_trace(arr, TraceScaling(clip_s=2.0))


def test_static_peak_holds_the_replicas_the_busiest_minute_needs(cluster):
    arr = steps([300, 1200, 300])  # 5, 20, 5 req/s: the peak minute has 1200 / 60 = 20 req/s
    r = evaluate("static-peak", cluster, arr)
    assert r.peak_rps == 20.0
    need = math.ceil(20.0 / (r.config.replica_capacity_rps * r.config.target_utilization))
    assert need >= 2  # the case must exercise more than the minimum
    ts = r.timeseries
    assert r.initial_replicas == need and r.summary.peak_replicas == need
    assert (ts["active"] == need).all() and (ts["starting"] == 0).all()
    assert r.scale_actions == 0 and r.replicas_started == 0
    gpus = cluster.scenario.deployment.num_gpus
    assert r.summary.gpu_hours == pytest.approx(need * gpus * r.summary.makespan_s / 3600)
    assert r.summary.cost_usd == pytest.approx(r.summary.gpu_hours * cluster.scenario.usd_per_gpu_hour)


def test_autoscalers_start_with_enough_for_the_first_minute(cluster):
    arr = steps([1200, 300])  # 20 req/s in the first minute
    for name in ("hbmserve", "ray-default", "queue-threshold"):
        r = evaluate(name, cluster, arr)
        first = math.ceil(20.0 / (r.config.replica_capacity_rps * r.config.target_utilization))
        assert r.initial_replicas == max(first, r.config.min_replicas), name


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_request_finishes_once_and_none_is_dropped(cluster, name):
    # A burst then quiet: autoscalers scale up and back down (drain) while requests are in flight.
    r = evaluate(name, cluster, steps([60, 1500, 60, 0, 30]))
    s = r.summary
    assert s.requests == 60 + 1500 + 60 + 30
    assert s.finished == s.requests and s.rejected == 0 and s.unfinished == 0
    assert r.dropped_requests == 0


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_requests_longer_than_max_model_len_count_as_dropped(cluster, name):
    arr = steps([120])
    too_long = cluster.scenario.engine.max_model_len  # prompt alone fills the context
    prompt = arr.prompt.copy()
    prompt[[5, 50]] = too_long
    r = evaluate(name, cluster, Arrivals(arr.t, prompt, arr.output))
    assert r.summary.rejected == 2 and r.dropped_requests == 2
    assert r.summary.finished == 120 - 2
    assert r.to_json_dict()["dropped_requests"] == 2


def test_scale_actions_count_changes_of_target_from_the_start():
    decisions = ((0.0, 3, "a"), (10.0, 5, "b"), (20.0, 5, "c"), (30.0, 2, "d"), (40.0, 3, "e"))
    assert count_scale_actions(decisions, initial=3) == 3  # 3->5, 5->2, 2->3
    assert count_scale_actions(decisions, initial=1) == 4  # the first decision is one too
    assert count_scale_actions((), initial=4) == 0


def test_scale_actions_per_hour_is_over_the_simulated_span(cluster):
    r = evaluate("queue-threshold", cluster, steps([60, 1500, 60, 0, 30]))
    assert r.scale_actions >= 1
    assert r.scale_actions_per_hour == pytest.approx(r.scale_actions / (r.summary.makespan_s / 3600))
    # Starts cancelled before serving are actions too (capacity/sim/evaluate.py "Counted").
    assert r.scale_actions == r.target_changes + r.cancelled_starts
    assert r.target_changes == count_scale_actions(r.decisions, r.initial_replicas)


def test_burst_schedule_has_the_asked_bursts_inside_the_trace():
    spec = BurstSpec(duration_s=1200.0, base_rps=1.0, burst_rps=6.0, bursts=3, burst_s=100.0)
    segs = burst_schedule(spec, seed=7)
    assert segs[0][0] == 0.0 and segs[-1][1] == 1200.0
    assert all(a[1] == pytest.approx(b[0]) for a, b in zip(segs, segs[1:]))  # contiguous
    bursts = [s for s in segs if s[2] == 6.0]
    assert len(bursts) == 3 and all(e - s == pytest.approx(100.0) for s, e, _ in bursts)
    # burst i lies in its own third of the trace
    assert all(400 * i <= s and e <= 400 * (i + 1) for i, (s, e, _) in enumerate(bursts))


def test_burst_trace_rate_follows_the_schedule():
    spec = BurstSpec(duration_s=1800.0, base_rps=2.0, burst_rps=20.0, bursts=2, burst_s=300.0)
    arr = burst_arrivals(spec, seed=3)
    assert np.all(np.diff(arr.t) >= 0) and arr.t[-1] < 1800.0
    for start, end, rps in burst_schedule(spec, seed=3):
        n = np.count_nonzero((arr.t >= start) & (arr.t < end))
        expected = rps * (end - start)
        assert abs(n - expected) < 5 * math.sqrt(expected) + 5  # Poisson count, 5 sigma


def test_same_seed_same_trace_and_result(cluster):
    spec = BurstSpec(duration_s=600.0, base_rps=2.0, burst_rps=15.0, bursts=1, burst_s=120.0)
    a, b = burst_arrivals(spec, seed=11), burst_arrivals(spec, seed=11)
    assert np.array_equal(a.t, b.t) and np.array_equal(a.prompt, b.prompt)
    assert np.array_equal(a.output, b.output)
    assert not np.array_equal(a.t[:50], burst_arrivals(spec, seed=12).t[:50])
    ra, rb = evaluate("hbmserve", cluster, a), evaluate("hbmserve", cluster, b)
    assert ra.to_json_dict() == rb.to_json_dict()
    assert ra.decisions == rb.decisions


@pytest.mark.parametrize("bad", [{"bursts": 3, "burst_s": 500.0, "duration_s": 1200.0},
                                 {"base_rps": 0.0}, {"bursts": -1}])
def test_burst_spec_rejects_impossible_shapes(bad):
    with pytest.raises(ValueError):
        BurstSpec(**bad)
