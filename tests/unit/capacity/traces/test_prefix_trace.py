"""The prefix-heavy trace: seeded, chained block ids, sessions that extend themselves, Zipf prompts."""

from __future__ import annotations

import numpy as np
import pytest

from hbmserve.capacity.traces.arrivals import TraceError
from hbmserve.capacity.traces.prefix_trace import PrefixTraceSpec, prefix_arrivals

SPEC = PrefixTraceSpec(duration_s=300.0, session_rps=1.0, think_s=10.0)


@pytest.fixture(scope="module")
def trace():
    return prefix_arrivals(SPEC, seed=3)


def test_same_seed_same_trace_and_another_seed_another(trace):
    again = prefix_arrivals(SPEC, seed=3)
    assert np.array_equal(trace.t, again.t) and trace.hashes == again.hashes
    assert not np.array_equal(prefix_arrivals(SPEC, seed=4).t[:10], trace.t[:10])


def test_sorted_within_the_window_and_every_request_fits_the_context(trace):
    assert np.all(np.diff(trace.t) >= 0) and trace.t[0] >= 0 and trace.t[-1] < SPEC.duration_s
    assert np.all(trace.prompt + trace.output <= SPEC.max_context_tokens)


def test_one_block_id_per_full_block_and_equal_ids_mean_equal_prefixes(trace):
    seen: dict[int, tuple[int, ...]] = {}
    for p, hs in zip(trace.prompt, trace.hashes):
        assert len(hs) == p // SPEC.block_tokens
        for i, h in enumerate(hs):
            assert seen.setdefault(h, hs[:i]) == hs[:i]  # the same id always follows the same prefix


def test_each_later_turn_extends_an_earlier_turn_whole():
    # A system prompt under one block: sessions share nothing, so "extends an earlier request"
    # means "is a later turn of its session". Geometric turns of mean 4: 3 requests in 4, less
    # the few later turns cut by the window's end (think time 1 s of 1,000 s).
    spec = PrefixTraceSpec(duration_s=1000.0, session_rps=1.0, think_s=1.0, system_prompt_tokens=2.0)
    trace = prefix_arrivals(spec, seed=2)
    seen: set[tuple[int, ...]] = set()
    extends = 0
    for hs in trace.hashes:
        extends += any(hs[:k] in seen for k in range(1, len(hs)))
        seen.add(hs)
    assert 0.72 < extends / len(trace) < 0.78  # 0.75 +- 3 sigma (about 1,000 sessions)


def test_sessions_of_one_system_prompt_share_its_blocks():
    trace = prefix_arrivals(PrefixTraceSpec(duration_s=120.0, system_prompts=1), seed=0)
    common = 0
    while all(len(hs) > common and hs[common] == trace.hashes[0][common] for hs in trace.hashes):
        common += 1
    # The shared run is the system prompt's whole blocks: at least one, at most half the context.
    assert 1 <= common <= PrefixTraceSpec().max_context_tokens // 2 // PrefixTraceSpec().block_tokens


def test_request_count_matches_sessions_times_turns():
    spec = PrefixTraceSpec(duration_s=2000.0, session_rps=2.0, think_s=1.0, user_tokens=20, output_tokens=20,
                           system_prompt_tokens=200)
    n = len(prefix_arrivals(spec, seed=0))
    expected = spec.session_rps * spec.duration_s * spec.mean_turns  # think time << duration: few cut
    assert abs(n - expected) < 5 * np.sqrt(expected * spec.mean_turns)


def test_zipf_popularity_favours_the_first_prompt():
    skewed = prefix_arrivals(PrefixTraceSpec(duration_s=600.0, session_rps=1.0, zipf_s=3.0), seed=1)
    firsts = [hs[0] for hs in skewed.hashes]
    top = max(set(firsts), key=firsts.count)
    # Weight 1 / k**3 over 8 prompts: the top one has 1 / 1.195 = 84% of sessions.
    assert 0.7 < firsts.count(top) / len(firsts) < 0.95


def test_bad_specs_are_named():
    with pytest.raises(TraceError, match="session_rps must be > 0"):
        PrefixTraceSpec(session_rps=0)
    with pytest.raises(TraceError, match="mean_turns"):
        PrefixTraceSpec(mean_turns=0.5)
