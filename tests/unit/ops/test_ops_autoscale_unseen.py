"""ops/bench/autoscale_unseen.py on a clipped seed: both runs judged against the fixed fleets."""

from __future__ import annotations

import json

from hbmserve.ops.bench import autoscale_unseen


def test_a_clipped_unseen_seed_is_judged_with_and_without_a_prior(tmp_path, capsys):
    out = tmp_path / "unseen.json"
    autoscale_unseen.main(["--trace", "burst", "--seeds", "5", "--clip", "600", "--own", "--out", str(out)])
    case = json.loads(out.read_text())["cases"][0]
    assert case["trace"] == "burst-5" and set(case["runs"]) == {"prior", "no prior", "own prior"}
    fleets = case["fleets"]
    assert "fixed-1" in fleets and all(0 <= f["slo_attainment"] <= 1 and f["gpu_hours"] > 0 for f in fleets.values())
    for run in case["runs"].values():
        # a fleet listed as dominating is at least as good on both axes and better on one
        for name in run["dominated_by"]:
            f = fleets[name]
            assert f["slo_attainment"] >= run["slo_attainment"] and f["gpu_hours"] <= run["gpu_hours"]
            assert (f["slo_attainment"], f["gpu_hours"]) != (run["slo_attainment"], run["gpu_hours"])
    assert "unseen seeds" in capsys.readouterr().out
