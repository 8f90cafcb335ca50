"""The live KV routing benchmark's pure parts (ops/bench/kv_routing_live.py): each mode's config,
and the trace's bounds in the simulated engine's own hashes. The cluster run itself is the
benchmark (docs/benchmarks.md), too long for CI."""

from __future__ import annotations

import pytest

from hbmserve.ops.bench import kv_routing_live as live
from hbmserve.ops.bench.prefix_routing_live import trace


@pytest.mark.parametrize("mode, router, events", [("precise", "choose", True), ("approximate", "choose", False),
                                                  ("round robin", "round-robin", True),
                                                  ("power of two", "power-of-two", True)])
def test_each_mode_is_the_same_model_with_its_router_and_event_source(mode, router, events):
    s = live.spec(mode, 18999, 2.0)
    (m,) = s.models
    assert s.serve.router == router and m.engine_settings.kv_events is events
    assert m.engine_settings.enable_prefix_caching and m.replicas == live.REPLICAS


def test_the_bounds_come_from_the_trace_and_order_as_bounds_do():
    turns = trace(seed=0, duration_s=20, sessions_per_s=1.5)
    b = live.bounds(turns, live.spec("precise", 18999, 2.0))
    # Later turns repeat their session's history and system prompts repeat across sessions.
    assert 0.3 < b["bound_lru"] <= b["bound_infinite"] < 1


def test_the_table_reports_the_share_of_the_lru_bound():
    row = {"prefix_hit_rate": 0.39, "bound_lru": 0.78, "bound_infinite": 0.8, "ttft_p50_s": 0.01, "ttft_p95_s": 0.02,
           "ok": 68, "sent": 68}
    assert "| precise | 39.0% (0.50x) | 78.0% | 80.0% | 0.010 | 0.020 | 68/68 |" in live.table({"median": {"precise": row}})
