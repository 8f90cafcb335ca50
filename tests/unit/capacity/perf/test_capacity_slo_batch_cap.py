"""The TPOT SLO as a batch cap (capacity/perf/slo_cap.py) and the SLO feasibility check, on the
prompt-heavy code-completion fixture (tests/unit/data/code_completion_trace.py)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hbmserve.capacity.perf.hardware import get_gpu
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment, cost_model, memory_fit
from hbmserve.capacity.perf.plan_analytic import EngineKnobs, Workload
from hbmserve.capacity.perf.slo_cap import (MIN_CHUNK_TOKENS, batch_cap, budget_for, chunk_step_s, knob_grid,
                                       slo_check)

DATA = Path(__file__).parents[2] / "data"
code_completion_arrivals = runpy.run_path(str(DATA / "code_completion_trace.py"))["code_completion_arrivals"]
DEP = Deployment(load_model_shape("llama-3.1-70b"), get_gpu("h100-sxm"), tp=4)
COST, KV = cost_model(DEP), memory_fit(DEP).kv_tokens
# The fixture's length mix (checked below): prompts ~2,000 tokens, outputs ~40.
CODE = Workload(rate_rps=8.0, peak_rps=11.0, prompt_mean=2000.0, output_mean=40.0, prompt_p95=3500.0, max_len=8000)
CTX = CODE.prompt_mean + CODE.output_mean / 2


def test_the_fixture_is_prompt_heavy_and_seeded():
    a = code_completion_arrivals(mean_rps=8.0, duration_s=600.0, seed=3)
    b = code_completion_arrivals(mean_rps=8.0, duration_s=600.0, seed=3)
    assert (a.t == b.t).all() and (a.prompt == b.prompt).all()
    assert 1800 < a.prompt.mean() < 2200 and 30 < a.output.mean() < 50
    assert a.prompt.min() >= 256 and a.prompt.max() <= 8000 and a.output.min() >= 4
    assert len(a) / 600.0 == pytest.approx(8.0, rel=0.15)  # the sine's swing averages out over a period
    assert a.prompt.sum() > 40 * a.output.sum()


def test_a_full_8192_token_chunk_step_is_the_issues_half_second():
    # Issue 14: "a decode step that carries a chunk of a 70B model takes about half a second on H100
    # TP=4". Roofline: 8,192 tokens x 2 x 70e9 FLOP / (4 x 989 TFLOP/s x efficiency) is ~0.5 s.
    step = chunk_step_s(COST, 8192, 128, CTX, CODE.prompt_mean)
    assert 0.5 < step < 0.65
    assert chunk_step_s(COST, 1024, 128, CTX, CODE.prompt_mean) < 0.1


@settings(max_examples=30, deadline=None)
@given(tpot=st.floats(0.03, 0.5), seqs=st.integers(1, 256))
def test_budget_for_is_the_largest_budget_whose_full_step_fits(tpot, seqs):
    b = budget_for(COST, tpot, seqs, CTX, CODE.prompt_mean)
    if b == 0:
        assert chunk_step_s(COST, seqs, seqs, CTX, CODE.prompt_mean) > tpot
        return
    assert chunk_step_s(COST, b, seqs, CTX, CODE.prompt_mean) <= tpot
    assert chunk_step_s(COST, b + 1, seqs, CTX, CODE.prompt_mean) > tpot


@settings(max_examples=20, deadline=None)
@given(tpot=st.floats(0.03, 0.4))
def test_batch_cap_knobs_fit_the_tpot_target_and_no_larger_batch_would(tpot):
    cap = batch_cap(COST, tpot, CODE, KV)
    assert cap.feasible
    assert chunk_step_s(COST, cap.max_num_batched_tokens, cap.max_num_seqs, CTX, CODE.prompt_mean) <= tpot
    assert cap.max_num_batched_tokens >= cap.max_num_seqs + MIN_CHUNK_TOKENS
    kv_seqs = int(KV // CTX)
    assert cap.max_num_seqs <= kv_seqs
    if cap.max_num_seqs < kv_seqs:  # TPOT-bound: one more decode leaves no room for a minimal chunk
        more = cap.max_num_seqs + 1
        assert chunk_step_s(COST, more + MIN_CHUNK_TOKENS, more, CTX, CODE.prompt_mean) > tpot


def test_no_batch_fits_a_tpot_below_one_decode():
    alone = chunk_step_s(COST, 1 + MIN_CHUNK_TOKENS, 1, CTX, CODE.prompt_mean)
    cap = batch_cap(COST, alone * 0.9, CODE, KV)
    assert not cap.feasible and "one sequence" in cap.reason
    assert knob_grid(COST, alone * 0.9, CODE, KV, (64,), (2048,)) == ()


def test_the_planner_grid_reaches_256_to_1024_token_chunks_and_nothing_over_the_cap():
    pairs = knob_grid(COST, 0.1, CODE, KV, (64, 128, 256), (256, 512, 1024, 2048, 4096, 8192))
    budgets = {b for _, b in pairs}
    assert {256, 512, 1024} <= budgets and not budgets & {2048, 4096, 8192}
    for seqs, budget in pairs:
        assert budget > seqs
        assert chunk_step_s(COST, budget, seqs, CTX, CODE.prompt_mean) <= 0.1


def test_slo_check_warns_with_the_number_when_light_load_hides_the_chunk_step():
    k = EngineKnobs(128, 8192, True, KV)
    check = slo_check(COST, k, CODE, 2.0, 0.1, lightest_rps=CODE.peak_rps / 16)
    cap = budget_for(COST, 0.1, 128, CTX, CODE.prompt_mean)
    assert check.feasible and check.blocker is None
    assert "8,192 tokens take 0.5" in check.advice or "8,192 tokens take 0.6" in check.advice
    assert f"<= {cap - cap % 64:,}" in check.advice
    assert check.to_json_dict()["slo_feasible"] is True and check.to_json_dict()["slo_blocker"] is None
    # Under the cap the same check is silent.
    quiet = slo_check(COST, EngineKnobs(128, 1024, True, KV), CODE, 2.0, 0.1, CODE.peak_rps / 16)
    assert quiet.feasible and quiet.advice is None


def test_slo_check_blocks_when_even_the_lightest_load_misses():
    # Six requests/s per replica is all max_replicas allows: prefill-bound at 8,192 tokens per step.
    k = EngineKnobs(128, 8192, True, KV)
    check = slo_check(COST, k, CODE, 2.0, 0.1, lightest_rps=6.5)
    assert not check.feasible and check.tpot_floor_s > 0.1
    assert "lower max_num_batched_tokens to <=" in check.blocker
    assert check.to_json_dict()["slo_blocker"] == check.blocker
    # A TPOT target under one decode step is blocked at any load, with the reason.
    tight = slo_check(COST, EngineKnobs(128, 1024, True, KV), CODE, 2.0, 0.005)
    assert not tight.feasible and "p95 TPOT" in tight.blocker and "one request at a time" in tight.blocker


def test_a_budget_whose_full_step_breaks_tpot_is_refused_with_the_one_that_fits():
    # Feasible on paper (light load hides the step), refused all the same: no fleet fixes a
    # step over the TPOT target (issue 27, requirement 3).
    check = slo_check(COST, EngineKnobs(128, 8192, True, KV), CODE, 2.0, 0.1, lightest_rps=CODE.peak_rps / 16)
    refusal = check.budget_refusal("models.m.engine_settings.max_num_batched_tokens")
    assert check.feasible and refusal.startswith("models.m.engine_settings.max_num_batched_tokens: ")
    assert f"set it to <= {check.budget_for_tpot:,}" in refusal and "8,192-token chunk" in refusal
    fits = slo_check(COST, EngineKnobs(128, check.budget_for_tpot, True, KV), CODE, 2.0, 0.1, CODE.peak_rps / 16)
    assert fits.budget_refusal("f") is None
    # Even the decodes alone over TPOT: the fix is the batch, not the chunk.
    crowded = slo_check(COST, EngineKnobs(128, 8192, True, KV), CODE, 2.0, 0.001)
    assert "lower max_num_seqs" in crowded.budget_refusal("f")
