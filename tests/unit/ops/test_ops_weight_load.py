"""The weight-load benchmark's summary: the disk is the fastest plain reader, loaders are scored
against it, and the chosen loader is the fastest median (not the fastest single run)."""

from __future__ import annotations

import pytest

from hbmserve.ops.bench.weight_load import DISK, summarize


def test_summary_takes_medians_and_the_faster_disk_reader() -> None:
    rounds = [
        {DISK[0]: 1.0, DISK[1]: 0.8, DISK[2]: 0.1, "a": 0.9, "b": 2.0},
        {DISK[0]: 1.2, DISK[1]: 0.9, DISK[2]: 0.1, "a": 1.0, "b": 0.5},
        {DISK[0]: 1.1, DISK[1]: 1.5, DISK[2]: 3.0, "a": 1.1, "b": 0.6},
    ]
    disk, results, chosen = summarize(rounds)
    assert disk == 1.1  # medians: read() 1.1, O_DIRECT 0.9, parallel 0.1 (its one fast run does not count)
    by = {r.method: r for r in results}
    assert by["a"].median_gbps == 1.0 and by["a"].ratio_to_disk == pytest.approx(1.0 / 1.1)
    assert by["b"].runs_gbps == (2.0, 0.5, 0.6)
    assert chosen == "a"  # b had the best run but the worse median
