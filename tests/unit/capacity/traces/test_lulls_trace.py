"""The "lulls and bursts" trace (capacity/traces/lulls_trace.py): two alternating states at the asked
rates, heavy-tailed sojourns whose mean and spread match the clipped log-normal they are drawn
from, the diurnal drift, the length mixes, and a seed fixes it; and, for it and the diurnal
trace, arrivals that follow the schedule (`schedule_arrivals`)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hbmserve.capacity.traces.diurnal_trace import DiurnalTraceSpec, diurnal_arrivals, diurnal_schedule
from hbmserve.capacity.traces.lulls_trace import LullsTraceSpec, lulls_arrivals, lulls_schedule, lulls_states
from hbmserve.capacity.traces.segments import LENGTH_MIXES


def clipped_lognormal(mean: float, cv: float, lo: float, hi: float) -> tuple[float, float]:
    """Mean and cv of min(max(X, lo), hi) for X log-normal with this mean and cv, from the
    partial moments E[X^k; lo < X < hi] = exp(k mu + k^2 s^2 / 2) (Phi(b - k s) - Phi(a - k s))."""
    s2 = math.log(1 + cv * cv)
    s, mu = math.sqrt(s2), math.log(mean) - s2 / 2
    a, b = (math.log(lo) - mu) / s, (math.log(hi) - mu) / s

    def phi(z: float) -> float:
        return 0.5 * (1 + math.erf(z / math.sqrt(2)))

    def moment(k: int) -> float:
        inside = math.exp(k * mu + k * k * s2 / 2) * (phi(b - k * s) - phi(a - k * s))
        return lo ** k * phi(a) + inside + hi ** k * (1 - phi(b))

    m1, m2 = moment(1), moment(2)
    return m1, math.sqrt(m2 - m1 * m1) / m1


def test_schedule_alternates_lulls_and_bursts_at_the_asked_rates_and_covers_the_trace():
    spec = LullsTraceSpec(duration_s=7200.0, lull_rps=2.0, burst_rps=14.0, burst_jitter=0.0)
    segs = lulls_schedule(spec, seed=3)
    assert segs[0][0] == 0.0 and segs[-1][1] == 7200.0
    assert all(a[1] == b[0] for a, b in zip(segs, segs[1:]))  # no gap, no overlap
    rates = [r for _, _, r in segs]
    assert set(rates) == {2.0, 14.0}  # bursts at 7x the lulls, as configured
    assert all(x != y for x, y in zip(rates, rates[1:]))  # the states alternate
    assert all(15.0 <= b - a <= 1800.0 for a, b, _ in segs[:-1])  # the clip; the last is cut


def test_sojourns_are_heavy_tailed_with_the_clipped_lognormal_mean_and_spread():
    spec = LullsTraceSpec(duration_s=400_000.0, burst_jitter=0.0)
    states = lulls_states(spec, seed=0)[:-1]  # the last sojourn is cut by the trace's end
    for rps, mean in ((spec.lull_rps, spec.lull_s), (spec.burst_rps, spec.burst_s)):
        stays = np.array([b - a for a, b, r in states if r == rps])
        want_mean, want_cv = clipped_lognormal(mean, 1.5, 15.0, 1800.0)
        assert len(stays) > 1000
        assert stays.mean() == pytest.approx(want_mean, rel=0.08)
        cv = stays.std() / stays.mean()
        assert cv == pytest.approx(want_cv, rel=0.12)
        assert cv > 1.2  # an exponential sojourn (a plain Markov chain) has cv 1


def test_burst_jitter_varies_each_burst_around_the_burst_rate():
    spec = LullsTraceSpec(duration_s=200_000.0, burst_jitter=0.3)
    heights = np.array([r for _, _, r in lulls_states(spec, seed=2) if r != spec.lull_rps])
    assert len(heights) > 500 and len(set(heights.tolist())) == len(heights)
    assert heights.mean() == pytest.approx(10.0, rel=0.05)  # the factor's mean is 1
    assert heights.std() / heights.mean() == pytest.approx(0.3, rel=0.15)


def test_diurnal_drift_multiplies_both_states_in_steps():
    flat = LullsTraceSpec(duration_s=3600.0, burst_jitter=0.0)
    spec = LullsTraceSpec(duration_s=3600.0, burst_jitter=0.0, diurnal_amplitude=0.5,
                          diurnal_period_s=3600.0, segment_s=60.0)
    states, segs = lulls_states(flat, seed=4), lulls_schedule(spec, seed=4)
    assert segs[0][0] == 0.0 and segs[-1][1] == 3600.0
    assert all(a[1] == pytest.approx(b[0]) for a, b in zip(segs, segs[1:]))
    for a, b, r in segs:
        assert math.floor(a / 60.0) == math.ceil(b / 60.0) - 1  # inside one minute's step
        state = next(rps for s, e, rps in states if s <= a < e)
        mid = math.floor(a / 60.0) * 60.0 + 30.0
        assert r == pytest.approx(state * (1 + 0.5 * math.sin(2 * math.pi * mid / 3600.0)))


# Both generators built on `schedule_arrivals`: the lulls trace with a drift, the diurnal one.
GENERATORS = [
    pytest.param(lulls_arrivals, lulls_schedule,
                 LullsTraceSpec(duration_s=1800.0, diurnal_amplitude=0.3, diurnal_period_s=900.0),
                 id="lulls"),
    pytest.param(diurnal_arrivals, diurnal_schedule, DiurnalTraceSpec(duration_s=1800.0, bursts=2),
                 id="diurnal"),
]


@pytest.mark.parametrize("arrivals, schedule, spec", GENERATORS)
def test_arrivals_follow_the_schedule_segment_by_segment(arrivals, schedule, spec):
    arr = arrivals(spec, 5)
    assert np.all(np.diff(arr.t) >= 0) and 0.0 <= arr.t[0] and arr.t[-1] < spec.duration_s
    for start, end, rps in schedule(spec, 5):
        n = np.count_nonzero((arr.t >= start) & (arr.t < end))
        # A renewal count's variance is about cv^2 times its mean: 5 sigma, and slack for the
        # first gap, which starts at the segment's start.
        assert abs(n - rps * (end - start)) < 5 * spec.gap_cv * math.sqrt(rps * (end - start)) + 5


@pytest.mark.parametrize("arrivals, schedule, spec", GENERATORS)
def test_same_seed_same_trace_other_seed_other_trace(arrivals, schedule, spec):
    a, b, c = arrivals(spec, 1), arrivals(spec, 1), arrivals(spec, 2)
    assert np.array_equal(a.t, b.t) and np.array_equal(a.prompt, b.prompt)
    assert np.array_equal(a.output, b.output)
    assert len(a) != len(c) or not np.array_equal(a.t, c.t)


def test_the_mix_sets_the_lengths_and_explicit_means_override_it():
    times = lulls_arrivals(LullsTraceSpec(duration_s=1800.0), seed=5).t
    for mix in ("prompt-heavy", "chat"):
        m = LENGTH_MIXES[mix]
        got = lulls_arrivals(LullsTraceSpec(duration_s=1800.0, mix=mix), seed=5)
        assert got.prompt.mean() == pytest.approx(m.prompt_tokens, rel=0.06)
        assert got.output.mean() == pytest.approx(m.output_tokens, rel=0.06)
        assert np.array_equal(got.t, times)  # the mix changes the lengths, not the times
    over = lulls_arrivals(LullsTraceSpec(duration_s=1800.0, prompt_tokens=500.0,
                                         output_tokens=100.0), seed=5)
    assert over.prompt.mean() == pytest.approx(500.0, rel=0.06)
    assert over.output.mean() == pytest.approx(100.0, rel=0.06)


@pytest.mark.parametrize("kwargs, words", [
    ({"lull_rps": 0}, "lull_rps must be > 0"), ({"burst_rps": 0.5}, "burst_rps must be > lull_rps"),
    ({"lull_s": 5.0}, "lull_s must lie in"), ({"burst_s": 4000.0}, "burst_s must lie in"),
    ({"sojourn_cv": -1}, "sojourn_cv"), ({"burst_jitter": -0.1}, "burst_jitter"),
    ({"diurnal_amplitude": 1.5}, "diurnal_amplitude"), ({"mix": "code"}, "mix 'code'"),
    ({"prompt_tokens": 0}, "prompt_tokens"), ({"max_sojourn_s": 10.0}, "max_sojourn_s")])
def test_bad_specs_name_the_field(kwargs, words):
    with pytest.raises(ValueError, match=words):
        LullsTraceSpec(**kwargs)
