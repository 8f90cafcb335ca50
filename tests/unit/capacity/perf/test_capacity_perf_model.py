"""The performance model against hand-computed values, and the seed's facts as regressions."""

from __future__ import annotations

import pytest

from hbmserve.capacity.perf.hardware import Link, get_gpu
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import (
    Deployment,
    allreduce_time,
    cost_model,
    memory_fit,
    pp_bubble_fraction,
)

H100 = get_gpu("h100-sxm")


def test_ring_allreduce_formula_by_hand():
    link = Link("x", 100e9, 50e9, 10e-6)
    # alpha + 2(n-1)/n * S/B = 10us + 2*3/4 * 1e6 / 50e9 = 10us + 30us
    assert allreduce_time(4, 1e6, link) == pytest.approx(40e-6)
    assert allreduce_time(1, 1e6, link) == 0.0


def test_seed_fact_405b_fp16_does_not_fit_one_h100_node_but_fp8_and_int8_do():
    m = load_model_shape("llama-3.1-405b")
    assert not memory_fit(Deployment(m, H100, tp=8)).fits
    for q in ("fp8", "int8"):
        fit = memory_fit(Deployment(m, H100, tp=8, quantization=q))
        assert fit.fits and fit.kv_tokens > 100_000, q


def test_seed_fact_allreduce_is_about_16x_costlier_off_nvlink():
    # One TP=8 all-reduce of a 2048-token prefill's activations (70B hidden 8192, bf16).
    msg = 2048 * 8192 * 2
    on = allreduce_time(8, msg, H100.intra_node)
    off = allreduce_time(8, msg, H100.host_link)
    assert 14 <= off / on <= 18


def test_kv_capacity_formula_by_hand():
    m = load_model_shape("llama-3.1-70b")
    fit = memory_fit(Deployment(m, H100, tp=4, gpu_memory_utilization=0.9))
    weights = m.weight_bytes() / 4
    kv = 80e9 * 0.9 - weights - H100.reserve_bytes
    assert fit.kv_tokens == int(kv // (2 * 80 * 2 * 128 * 2))


def test_decode_step_is_hbm_bound_and_matches_the_roofline_by_hand():
    m = load_model_shape("llama-3.1-8b")
    c = cost_model(Deployment(m, H100))
    ctx = 1000
    # Bytes: all weights but the input embedding rows, plus the KV read of ctx tokens and one write.
    nbytes = m.weight_bytes() - m.vocab * m.hidden * 2 + m.kv_bytes_per_token * (ctx + 1)
    mem = nbytes / (3.35e12 * 0.8)
    flops = 2 * 32 * m.linear_params_per_layer + 2 * m.vocab * m.hidden + 4 * 32 * 32 * 128 * ctx
    comp = flops / (989e12 * 0.6)
    assert mem > comp
    expected = H100.overheads.step_s + H100.overheads.per_seq_s + mem
    assert float(c.step_time(1, ctx)) == pytest.approx(expected, rel=1e-9)


def test_large_prefill_is_compute_bound():
    c = cost_model(Deployment(load_model_shape("llama-3.1-8b"), H100))
    n = 8192
    t = float(c.step_time(0, 0.0, n, n * (n + 1) / 2, n, 1))
    flops = c.flops_per_token * n + c.flops_per_logit + c.flops_per_attn_pair * n * (n + 1) / 2
    assert t == pytest.approx(H100.overheads.step_s + H100.overheads.per_seq_s + flops / (989e12 * 0.6), rel=1e-6)


def test_tp_adds_two_allreduces_per_layer():
    m = load_model_shape("llama-3.1-70b")
    c = cost_model(Deployment(m, H100, tp=4))
    t_mem = (c.dense_read_bytes + c.kv_bytes_per_token * 1) / (4 * 3.35e12 * 0.8)
    ar = allreduce_time(4, 8192 * 2, H100.intra_node)
    expected = H100.overheads.step_s + H100.overheads.per_seq_s + t_mem + 2 * 80 * ar
    assert float(c.step_time(1, 0.0)) == pytest.approx(expected, rel=1e-9)


def test_pipeline_bubble_and_handoff():
    assert pp_bubble_fraction(4, 1) == pytest.approx(0.75)
    assert pp_bubble_fraction(4, 8) == 0.0
    assert pp_bubble_fraction(1, 1) == 0.0
    m = load_model_shape("llama-3.1-70b")
    one = cost_model(Deployment(m, H100, tp=4, pp=1))
    two = cost_model(Deployment(m, H100, tp=4, pp=2))
    # A single decode sequence walks both stages in turn: same weight reads, plus one hand-off.
    handoff = H100.intra_node.latency_s + 8192 * 2 / H100.intra_node.bw_bytes_s
    assert float(two.step_time(1, 0.0)) == pytest.approx(float(one.step_time(1, 0.0)) + handoff, rel=1e-3)


def test_moe_reads_only_routed_experts_at_batch_one():
    m = load_model_shape("mixtral-8x7b")
    c = cost_model(Deployment(m, H100, tp=2))
    assert c.expert_hit == pytest.approx(2 / 8)
    assert float(c.step_time(1, 0.0)) < float(c.step_time(64, 0.0))


def test_fp8_halves_weight_reads():
    m = load_model_shape("llama-3.1-70b")
    bf16 = memory_fit(Deployment(m, H100, tp=4)).weights_per_rank_bytes
    fp8 = memory_fit(Deployment(m, H100, tp=4, quantization="fp8")).weights_per_rank_bytes
    assert 0.5 < fp8 / bf16 < 0.53


def test_prefill_tokens_per_s_packs_short_prompts_and_chunks_long_ones():
    cost = cost_model(Deployment(load_model_shape("llama-3.1-8b"), H100, tp=1))
    short, long = cost.prefill_tokens_per_s(512, 8192), cost.prefill_tokens_per_s(32_768, 8192)
    # 16 prompts of 512 in one 8,192-token step: exactly that step's rate.
    step = float(cost.step_time(0, 0.0, 8192, 16 * 512 * 513 / 2, 8192, 16))
    assert short == pytest.approx(8192 / step)
    # A long prompt attends over its whole prefix chunk by chunk: fewer tokens per second.
    assert long == pytest.approx(32_768 / cost.prefill_time(32_768, 8192)) and long < short
    # Prefill is compute-bound: an 8B model on one H100 computes thousands of prompt tokens a second.
    assert 5_000 < short < cost.roofline_tokens_per_s()
