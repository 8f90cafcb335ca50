"""`hbmserve plan-disagg` through typer's CliRunner: a workload in, the aggregated and split layouts,
the pick and why out (table or JSON), the break-even plot, and clear errors naming the option."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hbmserve.cli import tier_plan
from hbmserve.cli.main import build_app

# Ten chats a second for 30 s on Llama-3.1-70B: one TP4 replica carries them (test_disagg_plan.py).
CHATS = ("--model", "llama-3.1-70b", "--gpu", "h100", "--tp", "4", "--rate", "10", "--duration", "30",
         "--prompt-tokens", "600", "--output-tokens", "300", "--slo-ttft-p95", "3", "--slo-tpot-p95", "0.04",
         "--max-gpus", "8")


def invoke(*args: str):
    return CliRunner().invoke(build_app(), ["plan-disagg", *args])


def test_json_names_the_pick_its_reason_and_every_layout():
    r = invoke(*CHATS, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    best = out["best"]
    assert best["kind"] == "aggregated" and best["meets_slo"] and best["gpus"] == 4
    assert out["options"][0] == best and out["reason"].startswith(best["layout"])
    kinds = {o["kind"] for o in out["options"]}
    assert kinds == {"aggregated", "disaggregated"}
    split = next(o for o in out["options"] if o["kind"] == "disaggregated")
    assert split["gpus"] == 8 and split["link"] == "nvlink", "both pools in one 8-GPU node: NVLink"
    assert out["simulations"] >= len([o for o in out["options"] if not o["note"]])


def test_the_table_prints_each_layout_and_the_pick():
    r = invoke(*CHATS)
    assert r.exit_code == 0, r.output
    assert "aggregated 1 x TP4" in r.stdout and "split 1 prefill x TP4 : 1 decode x TP4" in r.stdout
    assert "aggregated: aggregated 1 x TP4" in r.stdout  # the pick's line, its kind first
    assert "Simulator predictions" in r.stdout


def test_plot_writes_the_break_even_png(tmp_path, monkeypatch):
    monkeypatch.setattr(tier_plan, "SWEEP_TPOT_MS", (15, 40))
    png = tmp_path / "be.png"
    r = invoke(*CHATS, "--plot", str(png), "--sweep", "tpot", "--sweep-seconds", "20")
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"break-even plot written to {png}" in r.stdout.replace("\n", "")


@pytest.mark.parametrize("args, message", [
    (("--link", "pigeon"), "--link 'pigeon': one of auto, nvlink, infiniband, host"),
    (("--sweep", "weather"), "--sweep 'weather': prompt or tpot"),
    (("--sweep-seconds", "0"), "--sweep-seconds: must be > 0"),
    (("--max-gpus", "2"), "--max-gpus 2: below one replica's 4 GPUs"),
    (("--slo-tpot-p95", "0"), "--slo-tpot-p95: must be > 0"),
    (("--pool-tps", "4,x"), "--pool-tps: not a comma-separated list of whole numbers"),
    (("--pool-tps", "2,4"), "--tp/--pool-tps: llama-3.1-70b on h100-sxm: TP2: weights"),
    (("--tp", "3"), "TP3: 64 attention heads do not split over 3 GPUs"),
    (("--gpu", "tpu"), "unknown gpu 'tpu'; known: a100-80g-sxm"),
    (("--trace", "x.csv"), "give exactly one of --rate RPS or --trace FILE"),
])
def test_bad_input_exits_2_naming_the_option(args, message):
    r = invoke(*CHATS, *args)
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split())


def test_plan_with_disagg_weighs_the_first_plans_layout_split():
    args = ["plan", "--model", "llama-3.1-70b", "--gpus", "h100", "--rate", "10", "--duration", "30",
            "--prompt-tokens", "600", "--output-tokens", "300", "--slo-ttft-p95", "3", "--slo-tpot-p95", "0.04",
            "--confirm-top", "1", "--quantization", "bf16", "--top", "1"]
    plain = CliRunner().invoke(build_app(), args)
    r = CliRunner().invoke(build_app(), [*args, "--disagg"])
    assert plain.exit_code == r.exit_code == 0, r.output
    assert "Aggregated or split" not in plain.stdout
    line = " ".join(r.stdout[r.stdout.index("Aggregated or split on h100-sxm TP4 bf16"):].split())
    assert "aggregated wins" in line and "split 1 prefill x TP4 : 1 decode x TP4" in line
    assert "hbmserve plan-disagg --model llama-3.1-70b --gpu h100-sxm --tp 4" in line
