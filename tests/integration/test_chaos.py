"""Chaos, briefly: ops/bench/chaos.py on a real three-node Ray cluster with simulated engines,
replicas killed every few seconds and a worker node removed under steady streaming load. The
benchmark's long run (2 minutes) is in docs/benchmarks.md; this one proves the same counts hold
in CI: every stream sent completes whole, with the broken ones moved to another replica."""

from __future__ import annotations

import pytest

from hbmserve.ops.bench import chaos

pytest.importorskip("ray", reason="ray is not installed (pip install -e '.[cpu]')")
pytestmark = pytest.mark.integration


def test_killing_replicas_and_a_node_under_load_loses_no_stream():
    args = chaos.main_args(["--duration-s", "12", "--warmup-s", "3", "--kill-every-s", "4", "--clients", "6",
                            "--tokens", "200", "--port", "18760"])
    result = chaos.run(args)
    print({k: v for k, v in result.items() if k != "args"})
    assert result["kills"] >= 2 and result["nodes_removed"] == 1
    assert result["sent"] > 0 and result["failed"] == 0, result["failures"]
    assert result["completed"] == result["sent"]
    assert result["migrated"] >= 1  # some stream was on a replica that went, and went on elsewhere
