"""The corpus's pairs of a trace and its service's past (ops/bench/autoscale_corpus.py, issue 38
requirement 2): the past is never the trace judged, a real trace's halves do not overlap, and
--quick names traces the corpus has."""

from __future__ import annotations

import numpy as np

from hbmserve.ops.bench import autoscale_corpus as ac


def test_every_generated_trace_has_another_seed_as_its_past_and_real_halves_split_cleanly():
    cases = ac.corpus(None)
    assert set(ac.QUICK) <= set(cases)
    assert isinstance(cases["azure-code-2nd"], str)  # no file given: skipped with the reason
    today, past = cases["lulls-1"]
    a, b = today(), past()
    assert len(a) and len(b) and not (len(a) == len(b) and np.array_equal(a.t, b.t))
    if not isinstance(cases["azure-conv-2nd"], str):
        second, first = cases["azure-conv-2nd"]
        whole, s, f = cases["azure-conv"][0](), second(), first()
        assert len(s) + len(f) == len(whole) and s.t[0] >= 0 and f.t[-1] <= whole.t[-1] / 2
    assert cases["azure-conv"][1] is None  # judged whole: no past of its own
