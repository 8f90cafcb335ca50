"""`decide` makes, decision for decision, the choices frozen in policy_golden.json: targets,
pool, reason text and PolicyState, over 300 seeded runs (tests/unit/data/policy_golden.py builds
them). Frozen from the monolithic version before it was split into stages; regenerated only on
purpose since (issue 10: scale-down demotes into the hot pool; issue 14: the pool's hysteresis,
starts kept until they serve, a 180 s backlog drain; issue 27: the burst envelope, off in a
third of the runs, whose targets did not move; issue 38: the envelope's base over three buckets,
when the rate last came down, how long bursts last, and the known top in the reasons, with every target and standby
count unchanged on all 300 cases; then a burst ends only below a quarter of the largest rise, again with
every target and standby count unchanged; then the envelope priced by each bucket's fluid backlog
and its hold changed only when the change pays for a start, both only with a prior, which these
cases do not have, and no pool standby for steps the envelope holds replicas for: again every
target and standby count unchanged)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parents[1] / "data"


def _golden_module():
    spec = importlib.util.spec_from_file_location("policy_golden", DATA / "policy_golden.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("policy_golden", module)
    spec.loader.exec_module(module)
    return module


golden = _golden_module()
EXPECTED = json.loads((DATA / "policy_golden.json").read_text())


def test_the_fixture_covers_every_case():
    assert len(EXPECTED) == golden.CASES == len(golden.cases())


@pytest.mark.parametrize("chunk", range(10))
def test_decide_reproduces_the_frozen_decisions(chunk):
    cases = golden.cases()
    for i in range(chunk, len(cases), 10):
        got = golden.record(golden.replay(cases[i]))
        want = EXPECTED[i]
        # Targets first, so a divergence names its step; then the digest of everything else.
        assert got["targets"] == want["targets"], f"case {i}"
        assert got["hot"] == want["hot"], f"case {i}"
        assert got["sha256"] == want["sha256"], f"case {i}: reason or PolicyState differs"
