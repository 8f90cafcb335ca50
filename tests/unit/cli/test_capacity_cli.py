"""`hbmserve simulate` and `hbmserve plan` through typer's CliRunner: the JSON contract and exit codes."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from hbmserve.cli.capacity import register

SIM_KEYS = {"ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s", "goodput_rps", "slo_attainment",
            "preemptions", "gpu_hours", "cost_usd", "usd_per_mtok", "sim_wall_s"}
PLAN_KEYS = {"gpu", "tp", "pp", "replicas", "warm_replicas", "quantization", "max_num_seqs",
             "max_num_batched_tokens", "chunked_prefill", "ttft_p95_s", "tpot_p95_s", "usd_per_hour",
             "usd_per_mtok_input", "usd_per_mtok_output", "usd_per_mtok_blended", "usd_per_1k_requests",
             "feasible", "status", "reason", "analytic_error", "quality_note"}
CLUSTER = """
models:
  - name: m70
    source: meta-llama/Llama-3.1-70B-Instruct
    engine: vllm-gpu
    engine_settings: {max_model_len: 4096, max_num_seqs: 64, max_num_batched_tokens: 1024}
    parallelism: {tp: 4}
    replicas: 2
    hardware: {gpu: h100-sxm, usd_per_gpu_hour: 2.0}
    sim: {model_config_name: llama-3.1-70b}
    slo: {ttft_p95_ms: 2000, tpot_p95_ms: 100}
"""


@pytest.fixture
def app() -> typer.Typer:
    a = typer.Typer()
    register(a)
    return a


@pytest.fixture
def files(tmp_path):
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(CLUSTER)
    trace = tmp_path / "trace.csv"
    rows = [f"{i * 0.5},{300 + 10 * i},{20 + i}" for i in range(40)]
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows) + "\n")
    return cfg, trace


def test_simulate_json_contract(app, files):
    cfg, trace = files
    r = CliRunner().invoke(app, ["simulate", "--config", str(cfg), "--trace", str(trace), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert SIM_KEYS <= set(out)
    assert out["requests"] == 40 and out["finished"] == 40
    # Two TP4 replicas at the config's $2/GPU-hour, billed for the whole run.
    assert out["cost_usd"] == pytest.approx(out["gpu_hours"] * 2.0)
    assert out["gpu_hours"] == pytest.approx(2 * 4 * out["makespan_s"] / 3600)


def test_simulate_says_whether_the_config_can_meet_its_slo_and_which_budget_would(app, files, tmp_path):
    cfg, trace = files
    big = tmp_path / "big.yaml"
    big.write_text(CLUSTER.replace("max_num_batched_tokens: 1024", "max_num_batched_tokens: 2048"))
    # 2,048-token chunks on a 70B TP4 replica take ~0.14 s per step: over the 0.1 s TPOT target,
    # which no replica count fixes: refused before the run, naming the budget that fits.
    r = CliRunner().invoke(app, ["simulate", "--config", str(big), "--trace", str(trace), "--json"])
    assert r.exit_code == 2 and "models.m70.engine_settings.max_num_batched_tokens" in r.output, r.output
    assert "set it to <= 1," in r.output and "--allow-slo-miss" in r.output
    # Asked to run anyway: one request at a time meets it, so feasible, with the warning.
    r = CliRunner().invoke(app, ["simulate", "--config", str(big), "--trace", str(trace), "--json",
                                 "--allow-slo-miss"])
    out = json.loads(r.stdout)
    assert out["slo_feasible"] is True and out["slo_blocker"] is None and out["chunk_step_s"] > 0.1
    cap = out["max_num_batched_tokens_for_tpot"]
    assert 1024 <= cap < 2048 and f"lower max_num_batched_tokens to <= {cap:,}" in r.stderr
    tight = tmp_path / "tight.yaml"
    tight.write_text(CLUSTER.replace("tpot_p95_ms: 100", "tpot_p95_ms: 5"))
    r = CliRunner().invoke(app, ["simulate", "--config", str(tight), "--trace", str(trace), "--json",
                                 "--allow-slo-miss"])
    out = json.loads(r.stdout)
    assert out["slo_feasible"] is False and "p95 TPOT" in out["slo_blocker"]
    assert "cannot meet its SLO at any replica count" in r.stderr


def test_plan_searches_lossy_formats_only_when_asked_and_flags_them(app):
    base = ["plan", "--model", "llama-3.1-8b", "--rate", "2", "--duration", "60", "--slo-ttft-p95", "2",
            "--slo-tpot-p95", "0.1", "--gpus", "l40s", "--confirm-top", "0", "--top", "3"]
    r = CliRunner().invoke(app, [*base, "--quantization", "int4"])
    assert "l40s TP1 int4 *" in r.stdout and "candidate" in r.stdout and "bf16" not in r.stdout
    assert "int4: int4 weights (AWQ/GPTQ) lose measurable accuracy" in r.stdout
    r = CliRunner().invoke(app, [*base, "--quantization", "bf16,int9"])
    assert r.exit_code == 2 and "unknown quantization 'int9'" in r.output


def test_simulate_table_and_plot(app, files, tmp_path):
    cfg, trace = files
    png, series = tmp_path / "ts.png", tmp_path / "series.json"
    r = CliRunner().invoke(app, ["simulate", "--config", str(cfg), "--trace", str(trace), "--plot", str(png),
                                 "--series", str(series)])
    assert r.exit_code == 0, r.output
    assert "TTFT" in r.stdout and "GPU-hours" in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ts = json.loads(series.read_text())["series"]
    assert sum(ts["arrivals_per_s"]) == 40 and set(ts["active"]) == {2.0}


def test_simulate_bad_input_is_one_line_and_exit_2(app, files, tmp_path):
    cfg, _ = files
    r = CliRunner().invoke(app, ["simulate", "--config", str(tmp_path / "nope.yaml"), "--rate", "1"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert r.output.strip().startswith("error: config file not found")
    r = CliRunner().invoke(app, ["simulate", "--config", str(cfg), "--rate", "1", "--gpu", "tpu"])
    assert r.exit_code == 2 and "unknown gpu" in r.output and "h100-sxm" in r.output
    r = CliRunner().invoke(app, ["simulate", "--config", str(cfg)])
    assert r.exit_code == 2 and "--trace" in r.output


def test_plan_json_contract(app, tmp_path):
    png = tmp_path / "frontier.png"
    r = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-8b", "--rate", "2", "--duration", "60",
                                 "--slo-ttft-p95", "2", "--slo-tpot-p95", "0.1", "--gpus", "h100,l40s",
                                 "--confirm-top", "1", "--json", "--plot", str(png)])
    assert r.exit_code == 0, r.output
    plans = json.loads(r.stdout)
    assert isinstance(plans, list) and plans
    assert all(PLAN_KEYS <= set(p) for p in plans)
    assert plans[0]["feasible"] and plans[0]["gpu"] in ("h100-sxm", "l40s")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_plan_infeasible_exits_1_with_the_closest_plan(app):
    r = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-70b", "--rate", "1", "--duration", "30",
                                 "--slo-ttft-p95", "0.5", "--slo-tpot-p95", "0.001", "--gpus", "h100",
                                 "--confirm-top", "1"])
    assert r.exit_code == 1
    assert "No configuration meets" in r.stdout and "blocked:" in r.stdout and "TPOT" in r.stdout


def test_plan_bad_inputs(app):
    base = ["plan", "--model", "llama-3.1-8b", "--slo-ttft-p95", "1", "--slo-tpot-p95", "0.1"]
    r = CliRunner().invoke(app, base)
    assert r.exit_code == 2 and "--rate" in r.output
    r = CliRunner().invoke(app, [*base, "--rate", "1", "--gpus", "h"])
    assert r.exit_code == 2 and "ambiguous" in r.output
    r = CliRunner().invoke(app, [*base, "--rate", "1", "--price", "h100=cheap"])
    assert r.exit_code == 2 and "GPU=USD" in r.output


def test_simulate_with_a_registered_policy_and_a_bad_one(app, files):
    cfg, trace = files
    r = CliRunner().invoke(app, ["simulate", "--config", str(cfg), "--trace", str(trace), "--json",
                                 "--policy", "static-peak"])
    # A fixed replica count gives a policy nothing to scale between: say so, naming the field.
    assert r.exit_code == 2 and "models.m70.autoscaling: missing" in r.output
    cfg.write_text(cfg.read_text().replace(
        "    engine: vllm-gpu\n", "    engine: vllm-gpu\n    autoscaling: {min_replicas: 1, max_replicas: 3}\n", 1))
    r = CliRunner().invoke(app, ["simulate", "--config", str(cfg), "--trace", str(trace), "--json",
                                 "--policy", "static-peak"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["finished"] == 40 and out["peak_replicas"] >= 1
    r = CliRunner().invoke(app, ["simulate", "--config", str(cfg), "--trace", str(trace), "--policy", "nope"])
    assert r.exit_code == 2 and "not a registered policy" in r.output
