"""The fluid backlog per headroom (autoscale/memory/backlog.py): what a bucket would have missed at
each capacity over its base, measured from the rate's own shape rather than its top alone."""

from __future__ import annotations

import pytest

from hbmserve.autoscale.memory import backlog

STEP, TTFT = 1.0, 2.0


def _feed(rates: list[float], base: float = 0.0) -> tuple[tuple[float, ...], tuple[float, ...]]:
    queues: tuple[float, ...] = ()
    misses: tuple[float, ...] = ()
    for r in rates:
        queues, misses = backlog.advance(queues, misses, rate_rps=r, base_rps=base, dt_s=1.0,
                                         step_rps=STEP, ttft_s=TTFT)
    return queues, misses


def test_a_short_top_misses_nothing_where_a_long_one_at_the_same_height_misses_most_of_it():
    # Both reach 10 req/s over a base of 1. At 8 req/s of capacity (headroom 7) the short top's
    # backlog (2/s for 5 s = 10) stays under 2 s of work (16); the long one's passes it after 8 s.
    _, short = _feed([1.0] * 5 + [10.0] * 5 + [1.0] * 30, base=1.0)
    _, long_ = _feed([1.0] * 5 + [10.0] * 120 + [1.0] * 30, base=1.0)
    assert backlog.missed_at(backlog.closed(short), 7.0, STEP, 180.0) == 0.0
    assert backlog.missed_at(backlog.closed(long_), 7.0, STEP, 180.0) == pytest.approx(10.0 * (120 - 8), rel=0.05)
    # With no headroom over the base, both miss everything from when the backlog passes 2 s.
    assert backlog.closed(short)[0] > 0 and backlog.closed(long_)[0] > backlog.closed(short)[0]


def test_misses_never_grow_with_headroom_and_vanish_past_the_top():
    _, misses = _feed([2.0] * 10 + [14.0] * 60 + [2.0] * 60, base=2.0)
    curve = backlog.closed(misses)
    assert all(a >= b for a, b in zip(curve, curve[1:]))
    assert len(curve) <= 13  # no headroom at or past the 12 req/s rise misses anything
    assert backlog.missed_at(curve, 12.0, STEP, 180.0) == 0.0


def test_a_backlog_drains_after_the_top_and_larger_headrooms_forget_it():
    queues, _ = _feed([10.0] * 30, base=0.0)
    assert queues and queues[0] == pytest.approx(300.0)  # no capacity: all of it waits
    drained, _ = backlog.advance(queues, (), rate_rps=0.0, base_rps=0.0, dt_s=10.0, step_rps=STEP, ttft_s=TTFT)
    assert len(drained) < len(queues)  # the headrooms that kept up are idle and dropped


def test_between_grid_points_the_misses_are_interpolated_and_below_the_base_they_keep_growing():
    curve = (100.0, 50.0, 0.0)
    assert backlog.missed_at(curve, 0.5, STEP, 180.0) == pytest.approx(75.0)
    assert backlog.missed_at(curve, 5.0, STEP, 180.0) == 0.0
    assert backlog.missed_at(curve, -1.0, STEP, 180.0) > backlog.missed_at(curve, -0.5, STEP, 180.0) > 100.0


def test_past_the_last_kept_point_the_misses_slope_to_zero_like_every_other_step():
    # `closed` drops trailing zeros, so (100, 40) stands for (100, 40, 0, ...): a headroom just
    # under the next grid point misses almost nothing, not all of the last point's 40.
    curve = backlog.closed((100.0, 40.0, 0.0, 0.0))
    assert curve == (100.0, 40.0)
    assert backlog.missed_at(curve, 1.5, STEP, 180.0) == pytest.approx(20.0)
    assert backlog.missed_at(curve, 1.95, STEP, 180.0) == pytest.approx(2.0)
    assert backlog.missed_at(curve, 2.0, STEP, 180.0) == 0.0


def test_a_gap_in_the_samples_is_not_integrated_past_ten_seconds():
    queues, _ = backlog.advance((), (), rate_rps=10.0, base_rps=0.0, dt_s=600.0, step_rps=STEP, ttft_s=TTFT)
    assert queues[0] == pytest.approx(10.0 * backlog.MAX_DT_S)


def test_a_curve_read_on_another_grid_keeps_its_shape():
    curve = (100.0, 80.0, 60.0, 40.0, 20.0)
    finer = backlog.regrid(curve, 1.0, 0.5)
    assert finer[0] == 100.0 and finer[2] == pytest.approx(80.0) and finer[1] == pytest.approx(90.0)
    assert backlog.regrid(curve, 1.0, 1.0) == curve
