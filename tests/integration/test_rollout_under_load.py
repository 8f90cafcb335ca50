"""A rollout under load, briefly: ops/bench/rollout_under_load.py on a real Ray cluster whose one node holds
exactly the fleet's GPUs. A changed model section rolls replica by replica and a broken version
rolls back, while clients stream; every stream completes whole and Ray never hands out more
GPUs than the fleet's. The longer run is in docs/benchmarks.md."""

from __future__ import annotations

import pytest

from hbmserve.ops.bench import rollout_under_load as rollout

pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[cpu]')")
pytestmark = pytest.mark.integration


def test_a_changed_model_rolls_through_and_a_broken_one_rolls_back_under_load_losing_nothing():
    args = rollout.main_args(["--replicas", "2", "--clients", "4", "--tokens", "100", "--warmup-s", "2",
                              "--pause-s", "2", "--ready-timeout-s", "20", "--port", "18790"])
    result = rollout.run(args)
    print({k: v for k, v in result.items() if k not in ("samples", "args")})
    assert result["failed"] == 0, result["failures"]
    assert result["sent"] > 0 and result["completed"] == result["sent"]
    assert result["most_gpus_held"] <= 2
    done, back = result["rollouts"]
    assert (done["phase"], done["to"]) == ("done", "sim-roll@2")
    assert [s["new"] for s in done["steps"]] == [0, 1, 1, 2, 2]  # one replica at a time, none beyond the fleet
    assert back["phase"] == "rolled_back" and "no model directory at /nonexistent/weights" in " ".join(s["reason"] for s in back["steps"])
    assert result["deployed_apps"] == {"sim-roll": "sim-roll@2"}  # the broken version left nothing behind
    assert result["last_rollouts"] == {"sim-roll": "rolled_back"}
    # Served throughout: streams completed inside each rollout's window.
    completed = {t: n for t, _, _, n in result["samples"]}
    for r in result["rollouts"]:
        first, last = r["steps"][0]["at_s"], r["steps"][-1]["at_s"]
        inside = [n for t, n in completed.items() if first <= t <= last]
        assert inside and inside[-1] > inside[0], r
