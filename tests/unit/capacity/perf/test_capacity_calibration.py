"""Calibration: the closed-loop replay, and a fit that recovers known overheads from their output."""

from __future__ import annotations

import pytest

from hbmserve.capacity.perf.calibration import MeasuredPoint, closed_loop, fit_profile, nelder_mead, predict
from hbmserve.capacity.perf.engine_core import EngineConfig
from hbmserve.capacity.perf.hardware import get_gpu
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment, cost_model

CPU = get_gpu("cpu-local")
TINY = load_model_shape("tiny-llama")
CFG = EngineConfig(num_blocks=4096, max_num_seqs=32, max_num_batched_tokens=2048, max_model_len=512)


def test_nelder_mead_finds_a_quadratic_minimum():
    x, fx, _ = nelder_mead(lambda v: (v[0] - 1.5) ** 2 + 3 * (v[1] + 0.5) ** 2, [0.0, 0.0], max_evals=400, tol=1e-12)
    assert x[0] == pytest.approx(1.5, abs=1e-3) and x[1] == pytest.approx(-0.5, abs=1e-3) and fx < 1e-6


def test_closed_loop_at_concurrency_one_is_prefill_then_decodes_by_hand():
    prof = CPU.with_overheads(step_s=0.005, per_seq_s=0.001, request_s=0.01)
    dep = Deployment(TINY, prof)
    out = closed_loop(dep, CFG, concurrency=1, num_requests=4, prompt=64, output=8)
    c = cost_model(dep)
    prefill = float(c.step_time(0, 0.0, 64, 64 * 65 / 2, 64, 1))
    decode = [float(c.step_time(1, 65 + j)) for j in range(7)]
    assert out["ttft_p50_s"] == pytest.approx(0.01 + prefill)
    assert out["tpot_p50_s"] == pytest.approx(sum(decode) / 7)


def test_fit_recovers_overheads_and_cuts_mape():
    truth = CPU.with_overheads(step_s=0.004, per_seq_s=0.0006, request_s=0.015).with_efficiency(flops=0.3)
    shapes = [MeasuredPoint(c, 48, 64, 32) for c in (1, 4, 16)]
    preds = predict(truth, TINY, CFG, shapes)
    measured = [MeasuredPoint(p.concurrency, p.num_requests, p.prompt_tokens, p.output_tokens, **pr)
                for p, pr in zip(shapes, preds)]
    res = fit_profile(CPU, TINY, CFG, measured, max_evals=250)
    assert res.mape_after_pct < 2.0 < res.mape_before_pct
    assert res.profile.overheads.step_s == pytest.approx(0.004, rel=0.1)
    assert res.profile.overheads.per_seq_s == pytest.approx(0.0006, rel=0.1)
    assert res.profile.overheads.request_s == pytest.approx(0.015, rel=0.1)
    assert {r["metric"] for r in res.rows} == {"ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s"}


def test_benchmark_script_reads_vllm_result_keys_and_reports_mape(tmp_path):
    import json

    from hbmserve.ops.bench.calibrate_cpu import main, parse_point

    p = parse_point({"max_concurrency": 16, "num_prompts": 64, "p50_ttft_ms": 179, "p95_ttft_ms": 240,
                     "median_tpot_ms": 12}, 64, 32)
    assert (p.concurrency, p.num_requests, p.prompt_tokens) == (16, 64, 64)
    assert p.ttft_p50_s == pytest.approx(0.179) and p.ttft_p95_s == pytest.approx(0.24)
    assert p.tpot_p50_s == pytest.approx(0.012) and p.tpot_p95_s is None
    src = tmp_path / "m.json"
    src.write_text(json.dumps({"model_config": "tiny-llama", "points": [
        {"concurrency": 1, "num_requests": 16, "ttft_p50_s": 0.03, "tpot_p50_s": 0.006},
        {"concurrency": 8, "num_requests": 16, "ttft_p50_s": 0.09, "tpot_p50_s": 0.009}]}))
    out = tmp_path / "o.json"
    assert main([str(src), "--fit-on", "1", "--max-evals", "60", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["fit_on"] == [1] and res["mape_held_out_pct"] is not None
    assert res["mape_fitted_pct"] >= 0 and len(res["rows"]) == 4
