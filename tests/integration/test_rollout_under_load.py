"""A rollout under load, briefly: ops/bench/rollout_under_load.py on a real Ray cluster whose one node holds
exactly the fleet's GPUs. A changed model section rolls replica by replica and a broken version
rolls back, while clients stream; every stream completes whole and Ray never hands out more
GPUs than the fleet's. The longer run is in docs/benchmarks.md."""

from __future__ import annotations

import pytest

from hbmserve.ops.bench import rollout_under_load as rollout

pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[cpu]')")
pytestmark = pytest.mark.integration


def _run_losing_nothing(*extra: str) -> dict:
    """Two deploys under load (a good version, then a broken one) on a node with the fleet's 2 GPUs."""
    args = rollout.main_args(["--replicas", "2", "--clients", "4", "--tokens", "100", *extra])
    result = rollout.run(args)
    print({k: v for k, v in result.items() if k not in ("samples", "args")})
    assert result["failed"] == 0, result["failures"]
    assert result["sent"] > 0 and result["completed"] == result["sent"]
    assert result["most_gpus_held"] <= 2
    return result


def test_a_changed_model_rolls_through_and_a_broken_one_rolls_back_under_load_losing_nothing():
    result = _run_losing_nothing("--warmup-s", "2", "--pause-s", "2", "--ready-timeout-s", "20", "--port", "18790")
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


def test_an_autoscaled_model_is_updated_in_place_and_a_broken_version_is_handed_back():
    result = _run_losing_nothing("--warmup-s", "1", "--pause-s", "1", "--ready-timeout-s", "60", "--port", "18792",
                                 "--autoscaled")
    done, back = result["rollouts"]
    assert (done["phase"], done["to"], back["phase"]) == ("done", "sim-roll", "rolled_back")
    assert len(done["steps"]) == 2, done  # a step per change of what Serve reports, not per poll
    assert "no model directory at /nonexistent/weights" in " ".join(s["reason"] for s in back["steps"])
    assert back["steps"][-1]["reason"] == "the old version runs on every replica again"
    assert result["deployed_apps"] == {"sim-roll": "sim-roll"}
