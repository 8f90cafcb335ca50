"""Per-token and per-request prices of a plan (capacity/perf/token_cost.py): input and output dollars
add up to the fleet's dollars, and each kind is charged the replica time it uses."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hbmserve.capacity.perf.hardware import get_gpu
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment, cost_model
from hbmserve.capacity.perf.plan_analytic import Workload
from hbmserve.capacity.perf.token_cost import token_costs

COST = cost_model(Deployment(load_model_shape("llama-3.1-70b"), get_gpu("h100-sxm"), tp=4))


def _w(rate: float, prompt: float, out: float) -> Workload:
    return Workload(rate, rate, prompt, out, prompt * 2, int(prompt * 2 + out))


@settings(max_examples=40, deadline=None)
@given(rate=st.floats(0.1, 50), prompt=st.floats(16, 8000), out=st.floats(1, 2000),
       usd=st.floats(1, 500), batch=st.floats(1, 256))
def test_input_and_output_dollars_add_up_to_the_fleets(rate, prompt, out, usd, batch):
    c = token_costs(COST, 1024, batch, _w(rate, prompt, out), usd)
    per_hour_in, per_hour_out = rate * 3600 * prompt / 1e6, rate * 3600 * out / 1e6
    assert c.usd_per_mtok_input * per_hour_in + c.usd_per_mtok_output * per_hour_out == pytest.approx(usd)
    assert c.usd_per_mtok_blended * (per_hour_in + per_hour_out) == pytest.approx(usd)
    assert c.usd_per_1k_requests == pytest.approx(usd / (rate * 3.6))
    assert 0 < c.input_share < 1


def test_each_kind_is_charged_the_replica_time_it_uses():
    w = _w(8.0, 2000.0, 40.0)
    c = token_costs(COST, 1024, 8.0, w, 100.0)
    t_in = COST.prefill_time(2000, 1024) / 2000
    t_out = float(COST.step_time(8, 8 * 2020)) / 8
    assert c.input_share == pytest.approx(2000 * t_in / (2000 * t_in + 40 * t_out))
    assert c.usd_per_mtok_output / c.usd_per_mtok_input == pytest.approx(t_out / t_in)
    # A prompt-heavy mix spends most of its money on input; quoting $/output token alone hid it.
    assert c.input_share > 0.5
    # A bigger decode batch shares each step's weight read among more sequences: cheaper outputs.
    assert token_costs(COST, 1024, 64.0, w, 100.0).usd_per_mtok_output < c.usd_per_mtok_output


def test_no_traffic_no_price():
    assert token_costs(COST, 1024, 1.0, _w(0.0, 100, 10), 10.0) is None
