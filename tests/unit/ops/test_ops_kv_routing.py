"""The KV routing benchmark (ops/bench/kv_routing.py) on a short trace: every router is run on
the same arrivals against the same bounds, the bounds hold, and the event-driven router keeps
the fleet's caches adding up where doors that remember only their own traffic cannot."""

from __future__ import annotations

import json

import pytest

from hbmserve.ops.bench import kv_routing


def test_every_router_against_the_same_bounds(tmp_path):
    cfg = kv_routing.BenchConfig(replicas=(4,), host_gib=(0.0,), seeds=(0,), traces=("multi-turn",), duration_s=300)
    rows = {r.mode: r for r in kv_routing.run(cfg)}
    assert set(rows) == set(kv_routing.modes(cfg.doors))
    bounds = {(r.median("bound_lru"), r.median("bound_infinite")) for r in rows.values()}
    assert len(bounds) == 1  # one trace, one fleet: one pair of bounds for every router
    lru, infinite = bounds.pop()
    assert 0 < lru <= infinite < 1
    for r in rows.values():
        assert r.median("hit_rate") <= infinite + 1e-9, r.mode
    precise, blind = rows["precise"].median("hit_rate"), rows["approximate, 4 doors"].median("hit_rate")
    assert precise >= 0.9 * lru and precise > blind + 0.05, (precise, blind, lru)
    assert rows["round robin"].median("hit_rate") < precise


def test_the_command_writes_json_and_a_table_and_refuses_an_unknown_trace(tmp_path, capsys):
    kv_routing.main(["--out", str(tmp_path), "--seeds", "0", "--replicas", "2", "--host-gib", "0",
                     "--traces", "agent-loops", "--duration-s", "120"])
    doc = json.loads((tmp_path / "kv_routing.json").read_text())
    assert {r["mode"] for r in doc["rows"]} == set(kv_routing.modes(4)) and doc["traces"]["agent-loops"]["duration_s"] == 120
    assert (tmp_path / "kv_routing.md").read_text().startswith("| trace | replicas |")
    with pytest.raises(SystemExit):
        kv_routing.main(["--traces", "nope"])
    assert "unknown trace 'nope'" in capsys.readouterr().err
