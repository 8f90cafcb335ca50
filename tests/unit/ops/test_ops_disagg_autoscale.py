"""ops/bench/disagg_autoscale.py: its traces, one short round, the table and the plot."""

from __future__ import annotations

import json

import pytest

from hbmserve.ops.bench import disagg_autoscale as bench


def test_traces_and_their_slos():
    arr, slo = bench.trace("long-bursts", 1, 300.0)
    assert len(arr) > 0 and slo.ttft_s == 2.0 and float(arr.prompt.mean()) > 3000
    arr, _ = bench.trace("long-output", 1, 300.0)
    assert float(arr.output.mean()) > 800
    if bench.AZURE_CONV.is_file():
        a1, slo = bench.trace("azure-conv", 1, 0.0)
        a2, _ = bench.trace("azure-conv", 2, 0.0)
        assert slo.ttft_s == 1.0 and a1.duration_s <= bench.WINDOW_S and len(a1) != len(a2)
    with pytest.raises(SystemExit, match="unknown trace"):
        bench.trace("nope", 1, 60.0)


def test_a_short_run_reports_every_run_and_plots(tmp_path):
    out, png = tmp_path / "r.json", tmp_path / "p.png"
    bench.main(["--traces", "long-bursts", "--seeds", "1", "--duration-s", "240", "--max-prefill", "2",
                "--max-decode", "1", "--out", str(out), "--plot", str(png)])
    rd = json.loads(out.read_text())["rounds"][0]
    names = [r["name"] for r in rd["runs"]]
    assert names[:2] == ["one policy", "per pool"] and names[2].startswith("oracle")
    assert any(n.startswith("static") for n in names) and rd["undercuts"] == []
    assert rd["one_policy_vs_oracle_gpu_h"] > 0 and png.stat().st_size > 10_000
