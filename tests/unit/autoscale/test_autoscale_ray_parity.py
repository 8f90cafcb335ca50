"""Ray Serve's default policy as mirrored in autoscale/baselines.py, checked against the
installed Ray 2.60's own functions (no Ray cluster is started: these are plain functions)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hbmserve.autoscale import baselines as bl

ray_policy = pytest.importorskip("ray.serve.autoscaling_policy", reason="ray[serve] not installed")
ray_config = pytest.importorskip("ray.serve.config", reason="ray[serve] not installed")
ray_metrics = pytest.importorskip("ray.serve._private.metrics_utils",
                                  reason="ray[serve] not installed")
ray_common = pytest.importorskip("ray.serve._private.common", reason="ray[serve] not installed")
ray_constants = pytest.importorskip("ray.serve._private.constants",
                                    reason="ray[serve] not installed")

factors = st.one_of(st.none(), st.floats(min_value=0.1, max_value=3.0))


def _ray_autoscaling_config(ours: bl.RayDefaultConfig):
    return ray_config.AutoscalingConfig(
        min_replicas=ours.min_replicas, max_replicas=ours.max_replicas,
        upscale_delay_s=ours.upscale_delay_s, downscale_delay_s=ours.downscale_delay_s,
        downscale_to_zero_delay_s=ours.downscale_to_zero_delay_s,
        upscaling_factor=ours.upscaling_factor, downscaling_factor=ours.downscaling_factor)


def test_defaults_are_rays_defaults():
    theirs = ray_config.AutoscalingConfig()
    ours = bl.RayDefaultConfig()
    for name in ("min_replicas", "max_replicas", "target_ongoing_requests", "upscale_delay_s",
                 "downscale_delay_s", "downscale_to_zero_delay_s", "smoothing_factor",
                 "upscaling_factor", "downscaling_factor", "look_back_period_s",
                 "metrics_interval_s"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.aggregation_function.value == theirs.aggregation_function.value
    assert ours.record_interval_factor == \
        ray_constants.RAY_SERVE_AUTOSCALING_METRIC_RECORD_INTERVAL_FACTOR


@settings(max_examples=300, deadline=None)
@given(desired=st.floats(min_value=0.0, max_value=50.0), current=st.integers(0, 20),
       up=factors, down=factors)
def test_scaling_factors_match_ray(desired, current, up, down):
    ours = bl.RayDefaultConfig(max_replicas=100, upscaling_factor=up, downscaling_factor=down)
    theirs = _ray_autoscaling_config(ours)
    assert bl._apply_scaling_factors(desired, current, ours) == \
        ray_policy._apply_scaling_factors(desired, current, theirs)


@settings(max_examples=300, deadline=None)
@given(desired=st.integers(0, 20), target=st.integers(0, 20), counter=st.integers(-5, 5),
       stamp=st.one_of(st.none(), st.floats(min_value=0.0, max_value=1000.0)),
       now=st.floats(min_value=0.0, max_value=2000.0),
       to_zero=st.one_of(st.none(), st.floats(min_value=0.0, max_value=900.0)))
def test_delay_logic_matches_ray(desired, target, counter, stamp, now, to_zero):
    ours = bl.RayDefaultConfig(max_replicas=100, downscale_to_zero_delay_s=to_zero)
    theirs = _ray_autoscaling_config(ours)
    got, state = bl._apply_delay_logic(
        desired, target, ours,
        bl.RayDefaultState(decision_counter=counter, decision_timestamp=stamp), now)
    want, ray_state = ray_policy._apply_delay_logic(
        desired, target, theirs,
        {ray_constants.SERVE_AUTOSCALING_DECISION_COUNTERS_KEY: counter,
         ray_constants.SERVE_AUTOSCALING_DECISION_TIMESTAMP_KEY: stamp}, _now=now)
    assert got == want
    keys = ray_constants
    assert state.decision_counter == ray_state[keys.SERVE_AUTOSCALING_DECISION_COUNTERS_KEY]
    assert state.decision_timestamp == ray_state[keys.SERVE_AUTOSCALING_DECISION_TIMESTAMP_KEY]


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.floats(min_value=0.0, max_value=100.0), min_size=1, max_size=8),
       gaps=st.lists(st.floats(min_value=0.5, max_value=10.0), min_size=8, max_size=8),
       tail=st.floats(min_value=0.0, max_value=10.0))
def test_window_mean_matches_rays_aggregation(values, gaps, tail):
    points, t = [], 0.0
    for v, g in zip(values, gaps):
        points.append((t, v))
        t += g
    now = points[-1][0] + tail
    last_window_s = now - points[-1][0] if now - points[-1][0] > 0 else 1e-3
    series = [ray_common.TimeStampedValue(ts, v) for ts, v in points]
    want = ray_metrics.aggregate_timeseries(series, ray_config.AggregationFunction.MEAN,
                                            last_window_s=last_window_s)
    assert bl.aggregate_pushed(tuple(points), now, bl.Aggregation.MEAN) == pytest.approx(want)
