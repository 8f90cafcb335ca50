"""ops/bench/relay_floor.py: every way streams every chunk, and each side's CPU is counted."""

from __future__ import annotations

import json

from hbmserve.ops.bench import relay_floor


def test_every_way_delivers_its_chunks_and_reports_both_sides(tmp_path):
    out = tmp_path / "r.json"
    relay_floor.main(["--rounds", "1", "--streams", "2", "--chunks", "50", "--port", "18791", "--out", str(out)])
    got = json.loads(out.read_text())
    assert [r["way"] for r in got["runs"]] == list(relay_floor.WAYS)
    for r in got["runs"]:
        # Chunks may coalesce in the kernel, so a reader can see fewer reads, never more (+ headers).
        assert r["chunks"] == 100 and 1 <= r["reads"] <= 100 + 4, r
        assert r["writer_us_per_chunk"] >= 0 and r["reader_us_per_chunk"] > 0, r
    assert set(got["medians"]) == set(relay_floor.WAYS)


def test_chunk_framing_is_http_chunked():
    assert relay_floor._chunk(b"abc") == b"3\r\nabc\r\n"
