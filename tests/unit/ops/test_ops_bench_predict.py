"""`hbmserve bench --predict`: the prediction is what `hbmserve simulate` computes for the same
requests, and a simulated engine's speedup is a change of clock (ops/bench_predict.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from hbmserve.capacity.traces.arrivals import Arrivals, read_trace
from hbmserve.cli.main import build_app
from hbmserve.core.config import ConfigError, load_cluster_spec, parse_cluster_spec
from hbmserve.core.config import SloSeconds
from hbmserve.ops.bench_predict import model_for, predict

CONFIG = """
models:
  - name: m8
    source: meta-llama/Llama-3.1-8B-Instruct
    engine: vllm-gpu
    engine_settings: {max_model_len: 4096, max_num_seqs: 16}
    replicas: 2
    hardware: {gpu: h100-sxm}
    sim: {model_config_name: llama-3.1-8b}
    slo: {ttft_p95_ms: 300, tpot_p95_ms: 30}
"""


def sim_model(speedup: float):
    return parse_cluster_spec({"models": [{
        "name": "s", "source": "sim", "engine": "sim", "replicas": 1,
        "engine_settings": {"max_model_len": 4096, "max_num_seqs": 8},
        "sim": {"gpu": "h100-sxm", "model_config_name": "llama-3.1-8b", "speedup": speedup}}]}).models[0]


def test_the_prediction_is_what_hbmserve_simulate_reports_for_the_same_requests(tmp_path):
    cfg, trace = tmp_path / "cluster.yaml", tmp_path / "trace.csv"
    cfg.write_text(CONFIG)
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                     + "".join(f"{i * 0.1:.1f},{500 + 37 * (i % 7)},{40 + i % 5}\n" for i in range(60)))
    r = CliRunner().invoke(build_app(), ["simulate", "--config", str(cfg), "--trace", str(trace), "--json",
                                         "--allow-slo-miss"])  # the budget is not the subject
    assert r.exit_code == 0, r.output
    simulated = json.loads(r.stdout)
    m = load_cluster_spec(cfg).models[0]
    p = predict(m, read_trace(trace), m.slo.seconds())
    got = p.figures.to_json_dict()
    for key in ("ttft_p50_s", "ttft_p95_s", "tpot_p95_s", "itl_p99_s", "e2e_p90_s", "output_tok_s", "goodput_rps",
                "slo_attainment"):
        assert got[key] == pytest.approx(simulated[key]), key
    assert p.clock == 1.0 and p.layout == "llama-3.1-8b on h100-sxm TP1, 2 replica(s)"


def test_a_simulated_engine_runs_on_a_clock_speedup_times_faster():
    rng = np.random.default_rng(1)
    arr = Arrivals(np.sort(rng.uniform(0, 2, 40)), rng.integers(100, 800, 40), rng.integers(10, 60, 40))
    fast = predict(sim_model(20.0), arr, SloSeconds(0.05, 0.002))
    # The same cluster at 1x, sent the same requests 20x slower and judged by a 20x looser SLO.
    slow = predict(sim_model(1.0), arr.scaled(20.0), SloSeconds(1.0, 0.04))
    assert fast.clock == 20.0 and "20x simulated engine" in fast.layout
    assert fast.figures.ttft.p95 == pytest.approx(slow.figures.ttft.p95 / 20)
    assert fast.figures.tpot.p50 == pytest.approx(slow.figures.tpot.p50 / 20)
    assert fast.figures.output_tok_s == pytest.approx(slow.figures.output_tok_s * 20)
    assert fast.figures.slo_attainment == pytest.approx(slow.figures.slo_attainment)


def test_the_config_model_is_the_served_name_or_the_only_one():
    spec = parse_cluster_spec({"models": [{"name": "a", "source": "sim", "engine": "sim"},
                                          {"name": "b", "source": "sim", "engine": "sim"}]})
    assert model_for(spec, "b", "c.yaml").name == "b"
    with pytest.raises(ConfigError, match="'x' is not in c.yaml"):
        model_for(spec, "x", "c.yaml")
    one = parse_cluster_spec({"models": [{"name": "a", "source": "sim", "engine": "sim"}]})
    assert model_for(one, "served-as-something-else", "c.yaml").name == "a"
