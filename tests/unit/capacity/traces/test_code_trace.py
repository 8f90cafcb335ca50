"""The synthetic code-completion trace (capacity/traces/code_trace.py): its rate follows the swell and
the spikes, its lengths the asked means, and a seed fixes it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hbmserve.capacity.traces.code_trace import CodeTraceSpec, code_arrivals, code_schedule


def test_schedule_swells_from_base_to_peak_and_back_with_spikes_in_their_shares():
    spec = CodeTraceSpec(duration_s=1200.0, base_rps=2.0, peak_rps=10.0, segment_s=60.0,
                         spikes=2, spike_s=60.0, spike_factor=2.0)
    segs = code_schedule(spec, seed=5)
    assert segs[0][0] == 0.0 and segs[-1][1] == 1200.0
    assert all(a[1] == pytest.approx(b[0]) for a, b in zip(segs, segs[1:]))  # contiguous

    def swell(t: float) -> float:  # the raised cosine at the middle of t's minute
        mid = math.floor(t / 60.0) * 60.0 + 30.0
        return 2.0 + 8.0 * 0.5 * (1 - math.cos(2 * math.pi * mid / 1200.0))

    spiked = [(a, b) for a, b, r in segs if r == pytest.approx(2.0 * swell(a))]
    assert sum(b - a for a, b in spiked) == pytest.approx(120.0)  # two 60 s spikes
    # each spike inside its own half of the trace
    starts = sorted(a for a, _ in spiked)
    assert starts[0] < 600.0 <= starts[-1]
    for a, b, r in segs:
        assert r == pytest.approx(swell(a)) or r == pytest.approx(2.0 * swell(a))
    calm = [r for a, b, r in segs if (a, b) not in spiked]
    assert min(calm) == pytest.approx(swell(0.0)) and max(calm) <= 10.0


def test_arrivals_follow_the_schedule_and_the_length_means():
    spec = CodeTraceSpec(duration_s=1800.0, spikes=1)
    arr = code_arrivals(spec, seed=3)
    assert np.all(np.diff(arr.t) >= 0) and 0.0 <= arr.t[0] and arr.t[-1] < 1800.0
    expected = sum((b - a) * r for a, b, r in code_schedule(spec, seed=3))
    assert len(arr) == pytest.approx(expected, rel=0.05)
    assert arr.prompt.mean() == pytest.approx(2000.0, rel=0.05)
    assert arr.output.mean() == pytest.approx(32.0, rel=0.05)
    assert np.std(arr.prompt) / arr.prompt.mean() == pytest.approx(0.5, rel=0.15)
    assert arr.output.min() >= 1


def test_same_seed_same_trace_other_seed_other_trace():
    spec = CodeTraceSpec(duration_s=600.0, spikes=1, spike_s=60.0)
    a, b, c = code_arrivals(spec, 1), code_arrivals(spec, 1), code_arrivals(spec, 2)
    assert np.array_equal(a.t, b.t) and np.array_equal(a.prompt, b.prompt)
    assert len(a) != len(c) or not np.array_equal(a.t, c.t)


@pytest.mark.parametrize("kwargs, words", [
    ({"peak_rps": 1.0}, "peak_rps"), ({"spike_factor": 0.5}, "spike_factor"),
    ({"spikes": 4, "spike_s": 1000.0}, "do not fit"), ({"prompt_tokens": 0}, "prompt_tokens"),
    ({"output_cv": -1}, "output_cv")])
def test_bad_specs_name_the_field(kwargs, words):
    with pytest.raises(ValueError, match=words):
        CodeTraceSpec(**kwargs)
