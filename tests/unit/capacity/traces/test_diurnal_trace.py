"""The "bursty diurnal" trace (capacity/traces/diurnal_trace.py): a stepped cosine swell whose mean is
the base rate, bursts in their own shares at 2-4x the swell, chat lengths by default. Its
arrivals against the schedule and its seeding are tested beside the lulls trace's, in
test_lulls_trace.py."""

from __future__ import annotations

import math

import pytest

from hbmserve.capacity.traces.diurnal_trace import (DiurnalTraceSpec, diurnal_arrivals, diurnal_bursts,
                                           diurnal_schedule)
from hbmserve.capacity.traces.segments import LENGTH_MIXES


def swell(t: float, base: float = 4.0, amplitude: float = 0.5, period: float = 3600.0) -> float:
    mid = math.floor(t / 60.0) * 60.0 + 30.0  # the middle of t's minute
    return base * (1 - amplitude * math.cos(2 * math.pi * mid / period))


def test_without_bursts_the_swell_averages_to_the_base_rate():
    segs = diurnal_schedule(DiurnalTraceSpec(bursts=0), seed=0)
    assert len(segs) == 60 and segs[0][0] == 0.0 and segs[-1][1] == 3600.0
    assert all(r == pytest.approx(swell(a)) for a, _, r in segs)
    # The cosine at the 60 step midpoints sums to 0 over a whole period: the mean is base_rps.
    assert sum((b - a) * r for a, b, r in segs) / 3600.0 == pytest.approx(4.0)
    assert min(r for *_, r in segs) == pytest.approx(swell(0.0))  # the trace opens at the trough


def test_bursts_lie_in_their_shares_at_two_to_four_times_the_swell():
    spec = DiurnalTraceSpec()
    bursts = diurnal_bursts(spec, seed=7)
    assert len(bursts) == 4
    for i, (start, end, factor) in enumerate(bursts):
        assert 900.0 * i <= start and end <= 900.0 * (i + 1)  # each in its own quarter
        assert 120.0 <= end - start <= 420.0 and 2.0 <= factor <= 4.0
    segs = diurnal_schedule(spec, seed=7)
    assert segs[0][0] == 0.0 and segs[-1][1] == 3600.0
    assert all(a[1] == pytest.approx(b[0]) for a, b in zip(segs, segs[1:]))  # no gap, no overlap
    for a, b, r in segs:
        factor = next((f for s, e, f in bursts if s <= a < e), 1.0)
        assert r == pytest.approx(swell(a) * factor)
    burst_time = sum(b - a for a, b, r in segs if r > swell(a) * 1.5)
    assert burst_time == pytest.approx(sum(e - s for s, e, _ in bursts))


def test_chat_lengths_by_default_prompt_heavy_on_request():
    chat, heavy = LENGTH_MIXES["chat"], LENGTH_MIXES["prompt-heavy"]
    for spec, m in ((DiurnalTraceSpec(duration_s=1800.0), chat),
                    (DiurnalTraceSpec(duration_s=1800.0, mix="prompt-heavy"), heavy)):
        arr = diurnal_arrivals(spec, seed=3)
        assert arr.prompt.mean() == pytest.approx(m.prompt_tokens, rel=0.06)
        assert arr.output.mean() == pytest.approx(m.output_tokens, rel=0.06)


@pytest.mark.parametrize("kwargs, words", [
    ({"base_rps": 0}, "base_rps"), ({"amplitude": 1.2}, "amplitude"),
    ({"period_s": 0}, "period_s"), ({"burst_max_s": 60.0}, "burst_max_s"),
    ({"burst_min_factor": 0.5}, "burst_min_factor"), ({"bursts": 10}, "do not fit"),
    ({"bursts": -1}, "bursts must be >= 0"), ({"mix": "code"}, "mix 'code'"),
    ({"output_tokens": -5}, "output_tokens")])
def test_bad_specs_name_the_field(kwargs, words):
    with pytest.raises(ValueError, match=words):
        DiurnalTraceSpec(**kwargs)
