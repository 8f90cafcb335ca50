"""`hbmserve bench`'s figures and the predicted-vs-measured comparison: hand-worked runs and
Hypothesis properties (ops/bench_figures.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hbmserve.ops.bench_figures import (FIGURE_KEYS, MAPE_KEYS, RequestRecord, compare, figures_of,
                                        figures_of_summary, relative_error_pct)
from hbmserve.core.config import SloSeconds
from hbmserve.capacity.sim.metrics import LatencyStats, summarize


def ok(i: int, sent: float, ttft: float, e2e: float, tokens: int, itl: tuple[float, ...] = ()) -> RequestRecord:
    return RequestRecord(i, sent, 100, tokens, ttft, e2e, itl, tokens)


def failed(i: int, sent: float, kind: str) -> RequestRecord:
    return RequestRecord(i, sent, 100, 10, error_kind=kind, error="x")


def test_a_hand_worked_run():
    records = [
        ok(0, 0.0, 0.1, 1.0, 10, (0.1,) * 9),  # TPOT (1.0 - 0.1) / 9 = 0.1
        ok(1, 1.0, 0.3, 2.3, 11, (0.2,) * 10),  # TPOT 2.0 / 10 = 0.2; finishes at 3.3
        ok(2, 2.0, 0.5, 0.5, 1),  # one token: no TPOT
        failed(3, 2.5, "429"),
        failed(4, 3.0, "timeout"),
    ]
    f = figures_of(records, SloSeconds(ttft_s=0.4, tpot_s=0.15))
    assert (f.sent, f.ok, f.errors, dict(f.errors_by_kind)) == (5, 3, 2, {"429": 1, "timeout": 1})
    assert f.ttft.p50 == pytest.approx(0.3) and f.ttft.mean == pytest.approx(0.3)
    assert f.tpot.p50 == pytest.approx(0.15)  # median of 0.1 and 0.2
    assert f.e2e.p99 == pytest.approx(np.percentile([1.0, 2.3, 0.5], 99))
    assert f.itl.p50 == pytest.approx(0.2)  # 9 gaps of 0.1, 10 of 0.2
    assert f.span_s == pytest.approx(3.3)  # the last completion
    assert f.request_rps == pytest.approx(3 / 3.3) and f.output_tok_s == pytest.approx(22 / 3.3)
    # Request 0 meets both; 1 misses TPOT; 2 misses TTFT (0.5 > 0.4); failures miss.
    assert f.goodput_rps == pytest.approx(1 / 3.3) and f.slo_attainment == pytest.approx(1 / 5)


def test_no_slo_means_no_goodput_and_an_open_loop_reports_its_lag():
    records = [replace(ok(0, 0.02, 0.1, 0.2, 2), scheduled_s=0.0), replace(ok(1, 0.5, 0.1, 0.2, 2), scheduled_s=0.49)]
    f = figures_of(records)
    assert f.goodput_rps is None and f.slo_attainment is None
    assert f.send_lag_max_s == pytest.approx(0.02)


def test_all_failed_is_zero_throughput_and_empty_latencies():
    f = figures_of([failed(0, 0.0, "connection"), failed(1, 1.0, "connection")], SloSeconds(1, 1))
    assert (f.ok, f.request_rps, f.slo_attainment, f.ttft.p50) == (0, 0.0, 0.0, None)
    assert f.to_json_dict()["errors_by_kind"] == {"connection": 2}
    # Found by hypothesis: a lone failure sent at a subnormal time made the span tiny, 0 x inf NaN.
    f = figures_of([failed(0, 5e-324, "429")], SloSeconds(1, 1))
    assert (f.request_rps, f.goodput_rps, f.output_tok_s) == (0.0, 0.0, 0.0)


record = st.builds(
    lambda i, sent, ttft, dur, tokens, kind: (
        ok(i, sent, ttft, ttft + dur * (tokens > 1), tokens, (dur / max(tokens - 1, 1),) * (tokens - 1))
        if kind is None else failed(i, sent, kind)),
    st.integers(0, 10**6), st.floats(0, 100), st.floats(1e-4, 10), st.floats(0, 10), st.integers(1, 50),
    st.one_of(st.none(), st.sampled_from(["429", "503", "timeout", "connection", "stream"])))


@settings(max_examples=60, deadline=None)
@given(st.lists(record, max_size=40), st.floats(1e-3, 5), st.floats(1e-3, 1))
def test_properties_of_any_run(records, slo_ttft, slo_tpot):
    f = figures_of(records, SloSeconds(slo_ttft, slo_tpot))
    assert f.sent == len(records) == f.ok + f.errors
    for stats in (f.ttft, f.tpot, f.itl, f.e2e):
        if stats.p50 is not None:
            assert stats.p50 <= stats.p90 <= stats.p95 <= stats.p99 + 1e-12
    assert 0.0 <= f.slo_attainment <= 1.0
    assert f.goodput_rps <= f.request_rps + 1e-12
    assert f.output_tok_s * f.span_s == pytest.approx(sum(r.output_tokens for r in records if r.ok))
    assert f.span_s >= max([r.sent_s for r in records], default=0.0)


def test_relative_error_is_signed_and_undefined_without_a_measurement():
    assert relative_error_pct(1.1, 1.0) == pytest.approx(10.0)  # the simulator overestimates
    assert relative_error_pct(0.5, 1.0) == pytest.approx(-50.0)
    assert relative_error_pct(1.0, 0.0) is None and relative_error_pct(None, 1.0) is None
    assert relative_error_pct(1.0, None) is None and relative_error_pct(math.nan, 1.0) is None


def _figures(ttft: float, tpot: float) -> object:
    rec = [ok(i, float(i), ttft, ttft + tpot * 9, 10) for i in range(20)]
    return figures_of(rec, SloSeconds(1.0, 1.0))


def test_compare_errors_per_figure_and_mape_over_ttft_tpot_p50_p95():
    measured, predicted = _figures(0.2, 0.01), _figures(0.22, 0.008)
    cmp = compare(measured, predicted)
    assert [r.key for r in cmp.rows] == list(FIGURE_KEYS)
    rows = {r.key: r for r in cmp.rows}
    assert rows["ttft_p95_s"].error_pct == pytest.approx(10.0)
    assert rows["tpot_p50_s"].error_pct == pytest.approx(-20.0)
    # Every request identical: p50 and p95 alike, so MAPE = mean(10, 10, 20, 20).
    assert cmp.mape_pct == pytest.approx(15.0)
    assert cmp.to_json_dict()["mape_keys"] == list(MAPE_KEYS)


@settings(max_examples=30, deadline=None)
@given(st.floats(1e-3, 10), st.floats(1e-4, 1))
def test_a_perfect_prediction_has_no_error(ttft, tpot):
    f = _figures(ttft, tpot)
    cmp = compare(f, f)
    assert cmp.mape_pct == pytest.approx(0.0)
    assert all(r.error_pct in (None, pytest.approx(0.0)) for r in cmp.rows)


def test_a_simulated_engines_clock_divides_latencies_and_multiplies_rates():
    arrival = np.array([0.0, 10.0])
    s = summarize(arrival=arrival, first=arrival + 2.0, finish=arrival + 2.0 + 9 * 0.5, output=np.array([10, 10]),
                  total_requests=3, rejected=1, itl_values=np.full(18, 0.5), itl_weights=np.ones(18),
                  preemptions=0, gpu_seconds=1.0, usd_per_gpu_hour=1.0, makespan_s=20.0, replica_seconds=20.0,
                  peak_replicas=1, slo_ttft_s=4.0, slo_tpot_s=1.0)
    f = figures_of_summary(s, clock=10.0)
    assert f.ttft == LatencyStats(0.2, 0.2, 0.2, 0.2, 0.2) and f.tpot.p95 == pytest.approx(0.05)
    assert f.span_s == pytest.approx(2.0) and f.request_rps == pytest.approx(2 / 2.0)
    assert f.output_tok_s == pytest.approx(20 / 2.0) and f.goodput_rps == pytest.approx(2 / 2.0)
    assert (f.sent, f.ok, dict(f.errors_by_kind)) == (3, 2, {"400": 1})
    assert f.slo == SloSeconds(0.4, 0.1) and f.slo_attainment == pytest.approx(2 / 3)
