"""`hbmserve plan-adapters` through typer's CliRunner: a config in, the slot settings and the per-adapter
dollars out (table or JSON), clear errors; and `hbmserve plan --adapters N` adding the same figures."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from hbmserve.capacity.traces.adapter_trace import AdapterTraceSpec, adapter_arrivals
from hbmserve.capacity.traces.arrivals import write_jsonl_trace
from tests.unit.cli.test_tier_plan_cli import invoke as invoke_tier

CLUSTER = """
models:
  - name: m8
    source: meta-llama/Llama-3.1-8B-Instruct
    engine: vllm-gpu
    engine_settings: {max_model_len: 8192}
    hardware: {gpu: h100-sxm, usd_per_gpu_hour: 3.0}
    sim: {model_config_name: llama-3.1-8b}
    slo: {ttft_p95_ms: 500, tpot_p95_ms: 50}
"""
ADAPTERS = """
    adapters:
      - {name: support, source: org/support-lora}
      - {name: legal, source: org/legal-lora}
      - {name: sql, source: org/sql-lora}
"""
FAST = ("--rate", "10", "--duration", "10", "--gpu-slots", "1,4")


@pytest.fixture
def files(tmp_path):
    (tmp_path / "plain.yaml").write_text(CLUSTER)
    (tmp_path / "three.yaml").write_text(CLUSTER + ADAPTERS)
    write_jsonl_trace(adapter_arrivals(AdapterTraceSpec(adapters=6, rate_rps=10, duration_s=10), seed=2),
                      tmp_path / "named.jsonl")
    return tmp_path


def invoke(*args: str):
    return invoke_tier(*args, command="plan-adapters")


def test_the_json_has_every_slot_setting_the_pick_and_dollars_per_adapter_that_sum_to_the_fleets(files):
    r = invoke("--config", str(files / "plain.yaml"), "--adapters", "8", *FAST, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["adapters"] == 8 and out["model"] == "m8"
    # GPU slots 1 and 4; host slots each multiple of them below 8, and 8.
    assert sorted((o["max_loras"], o["max_cpu_loras"]) for o in out["options"]) == [
        (1, 1), (1, 2), (1, 4), (1, 8), (4, 4), (4, 8)]
    best = out["best"]
    assert best in out["options"] and out["reason"].startswith(f"{best['max_loras']} GPU slots")
    costs = out["adapter_costs"]
    assert sum(c["usd_input"] + c["usd_output"] for c in costs) == pytest.approx(best["usd"])
    assert sum(c["requests"] for c in costs) == out["requests"]
    assert {c["adapter"] for c in costs} <= {f"lora-{k}" for k in range(8)}


def test_the_models_own_adapters_are_planned_under_their_names_and_the_table_shows_hot_and_cold(files):
    r = invoke("--config", str(files / "three.yaml"), *FAST)
    assert r.exit_code == 0, r.output
    assert "m8: 3 adapters" in r.output and "slot settings" in r.output and "per adapter at the pick" in r.output
    assert "support" in r.output and "lora: {max_loras:" in r.output
    js = json.loads(invoke("--config", str(files / "three.yaml"), *FAST, "--json").output)
    assert {c["adapter"] for c in js["adapter_costs"]} == {"support", "legal", "sql"}


def test_a_trace_naming_adapters_is_planned_on_its_own_names_and_one_naming_none_gets_them_drawn(files):
    r = invoke("--config", str(files / "plain.yaml"), "--trace", str(files / "named.jsonl"), "--gpu-slots", "2",
               "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["adapters"] == 6 and {c["adapter"] for c in out["adapter_costs"]} <= {f"lora-{k}" for k in range(6)}
    (files / "plain.csv").write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                                     + "".join(f"{i * 0.1},300,50\n" for i in range(100)))
    r = invoke("--config", str(files / "three.yaml"), "--trace", str(files / "plain.csv"), "--gpu-slots", "2",
               "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["requests"] == 100 and {c["adapter"] for c in out["adapter_costs"]} <= {"support", "legal", "sql"}


@pytest.mark.parametrize("args, message", [
    (("--config", "plain.yaml"), "models.m8.adapters: the model declares none"),
    (("--config", "plain.yaml", "--adapters", "0"), "--adapters: must be >= 1"),
    (("--config", "three.yaml", "--gpu-slots", "0,4"), "--gpu-slots: each must be >= 1"),
    (("--config", "three.yaml", "--gpu-slots", "four"), "--gpu-slots: not a comma-separated list"),
    (("--config", "three.yaml", "--zipf", "-1"), "--zipf must be >= 0"),
    (("--config", "three.yaml", "--rate", "0"), "--rate and --duration > 0"),
    (("--config", "plain.yaml", "--trace", "named.jsonl", "--adapters", "4"), "names its own adapters"),
])
def test_bad_input_is_one_clear_error_and_exit_2(files, args, message):
    r = invoke(*(str(files / a) if a.endswith((".yaml", ".jsonl")) else a for a in args))
    assert r.exit_code == 2, r.output
    assert message in r.output


def test_plan_with_adapters_adds_the_slot_plan_of_the_first_plan():
    from hbmserve.cli.capacity import register as register_capacity

    app = typer.Typer()
    register_capacity(app)
    r = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-8b", "--slo-ttft-p95", "0.5", "--slo-tpot-p95",
                                 "0.05", "--rate", "4", "--duration", "20", "--gpus", "h100", "--quantization",
                                 "bf16", "--confirm-top", "1", "--top", "1", "--adapters", "6"])
    assert r.exit_code == 0, r.output
    assert "LoRA, 6 adapters at Zipf 1 on h100-sxm TP1 bf16" in r.output and "lora: {max_loras:" in r.output
    bad = CliRunner().invoke(app, ["plan", "--model", "llama-3.1-8b", "--slo-ttft-p95", "0.5", "--slo-tpot-p95",
                                   "0.05", "--rate", "4", "--adapters", "0"])
    assert bad.exit_code == 2 and "--adapters: must be >= 1" in bad.output
