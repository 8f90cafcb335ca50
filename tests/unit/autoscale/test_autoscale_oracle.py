"""The oracle's schedule (autoscale/oracle.py): `cover` is the cheapest schedule that serves a
need, checked against brute force over every schedule of up to two replicas, and feasible for
larger ones; `oracle_decide` replays it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hbmserve.autoscale.oracle import (OracleConfig, OracleState, cover, oracle_decide,
                                       schedule_cost_s)
from hbmserve.core.scaling import Snapshot


def serving_of_mask(mask: int, n: int, lead: int, initial: bool) -> np.ndarray:
    """Bins a replica held on the bins of `mask` serves: each held run [s, e) serves from s +
    lead (from 0 for a replica already serving at t=0, on its first run if it starts at 0)."""
    held = [(mask >> k) & 1 for k in range(n)]
    out = np.zeros(n, dtype=np.int64)
    k = 0
    while k < n:
        if not held[k]:
            k += 1
            continue
        e = k
        while e < n and held[e]:
            e += 1
        first = initial and k == 0
        out[k if first else min(e, k + lead): e] = 1
        k = e
    return out


def brute_min_cost(need: list[int], lead: int, initial: int) -> int | None:
    """Fewest replica-bins over every way to hold 2 replicas (the first `initial` serving at
    t=0) that serves `need`; None if none does."""
    n = len(need)
    masks = range(1 << n)
    first = np.array([serving_of_mask(m, n, lead, initial >= 1) for m in masks])
    second = np.array([serving_of_mask(m, n, lead, initial >= 2) for m in masks])
    cost = np.array([bin(m).count("1") for m in masks])
    ok = ((first[:, None, :] + second[None, :, :]) >= np.asarray(need)).all(axis=2)
    total = cost[:, None] + cost[None, :]
    return int(total[ok].min()) if ok.any() else None


def serving_of_schedule(schedule, start_s: float, initial: int, times: np.ndarray) -> np.ndarray:
    """Replicas serving at each time when the schedule's held count is followed: increases
    order new replicas, decreases cancel or release the newest first (as the simulator's
    victim rule does: not-yet-serving first)."""
    held: list[float] = [-np.inf] * min(initial, schedule[0][1])  # order times; -inf: serving at 0
    events = list(schedule)
    out = []
    i = 0
    for t in times:
        while i < len(events) and events[i][0] <= t:
            want = events[i][1]
            while len(held) < want:
                held.append(events[i][0])
            while len(held) > want:
                held.pop()
            i += 1
        out.append(sum(1 for o in held if o == -np.inf or o + start_s <= t))
    return np.asarray(out)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=1, max_size=7), st.integers(0, 4),
       st.integers(0, 2))
@example([1, 0, 0, 1], 3, 1)  # hold through a gap shorter than a start-up
@example([0, 0, 2, 0, 0, 0, 2], 2, 0)  # release through a longer one
def test_cover_costs_what_the_cheapest_of_all_schedules_costs(need, lead, initial):
    # Needs in the first `lead` bins above the replicas already serving cannot be met by any
    # schedule; the oracle's planner never asks for them (it counts them as initial).
    need = [min(x, initial) if k < lead else x for k, x in enumerate(need)]
    best = brute_min_cost(need, lead, initial)
    assert best is not None
    schedule = cover(need, bin_s=1.0, start_s=float(lead), initial=initial)
    assert schedule_cost_s(schedule, len(need)) == best
    t = np.arange(len(need)) + 0.5
    assert (serving_of_schedule(schedule, lead, initial, t) >= need).all()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=25), st.floats(0.0, 200.0),
       st.integers(0, 6), st.sampled_from([10.0, 30.0, 60.0]), st.integers(0, 2))
def test_cover_serves_every_interval_in_full(need, start_s, initial, bin_s, after):
    schedule = cover(need, bin_s, start_s, initial=initial, tick_s=1.0, after=after)
    # Inside each bin (its start and just before its end), from the first bin a start-up can
    # reach; before that, at least what was there at t=0 and is still needed.
    for k, x in enumerate(need):
        if k * bin_s < start_s and x > initial:
            continue
        t = np.array([k * bin_s, (k + 1) * bin_s - 1e-6])
        assert (serving_of_schedule(schedule, start_s, initial, t) >= x).all(), (k, schedule)
    assert schedule[-1][1] == after and schedule[-1][0] <= len(need) * bin_s
    assert all(t % 1.0 == 0.0 for t, _ in schedule)  # orders fall on ticks


def test_cover_by_hand():
    # One replica throughout; a third of an hour at 3: the two extra ordered 180 s early.
    # Level 2 is needed again 240 s after its spell ends: longer than a start-up, so released
    # at 240 and re-ordered at 480 - 180 = 300.
    need = [1, 1, 3, 3, 1, 1, 1, 1, 2]
    assert cover(need, 60.0, 180.0, initial=1, after=1) == (
        (0.0, 3), (240.0, 1), (300.0, 2), (540.0, 1))
    # With a 100 s start-up the extra two are ordered at 120 - 100 = 20 (not needed before);
    # the second spell of level 2 at 480 - 100 = 380.
    assert cover(need, 60.0, 100.0, initial=1, after=0) == (
        (0.0, 1), (20.0, 3), (240.0, 1), (380.0, 2), (540.0, 0))
    # Cost: 540 s of one, 220 s of two more, 160 s of one more (start-ups billed).
    assert schedule_cost_s(cover(need, 60.0, 100.0, initial=1), 600.0) == 540 + 2 * 220 + 160


def test_cover_holds_through_a_gap_no_longer_than_a_start_up():
    # Level 2's gap is 120 s: holding (120 s) beats releasing and re-ordering (180 s).
    assert cover([2, 1, 1, 2], 60.0, 180.0, initial=2) == ((0.0, 2), (240.0, 0))
    # A 240 s gap: release, re-order 180 s before it is needed.
    assert cover([2, 1, 1, 1, 1, 2], 60.0, 180.0, initial=2) == (
        (0.0, 2), (60.0, 1), (120.0, 2), (360.0, 0))


def test_initial_replicas_no_spell_needs_are_released_at_once():
    assert cover([1, 1], 60.0, 180.0, initial=3) == ((0.0, 1), (120.0, 0))


def test_oracle_decide_reads_the_schedule_at_now():
    config = OracleConfig(((0.0, 2), (100.0, 5), (400.0, 1)), note="test")
    state = OracleState()
    for now, want in ((0.0, 2), (99.9, 2), (100.0, 5), (399.0, 5), (400.0, 1), (1e9, 1)):
        decision, state = oracle_decide(Snapshot(now=now, replicas=()), config, state)
        assert decision.target_active == want
        assert "oracle" in decision.reason and not decision.target_standby


@pytest.mark.parametrize("schedule", [(), ((5.0, 1),), ((0.0, 1), (10.0, 2), (5.0, 1)),
                                      ((0.0, -1),)])
def test_oracle_config_rejects_a_malformed_schedule(schedule):
    with pytest.raises(ValueError):
        OracleConfig(schedule)
