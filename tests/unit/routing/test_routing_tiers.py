"""`choose` with a host-memory tier: a replica's score is its HBM run plus the host run that
continues it, each host block worth `host_block_value`; and the door's approximate memory
(RecentPrefixes) stays prefix-closed."""

from __future__ import annotations

from hbmserve.core.routing import ReplicaLoad, RouteRequest
from hbmserve.core.scaling import ReplicaState
from hbmserve.routing.choose import choose, tiered_blocks
from hbmserve.routing.prefix import RecentPrefixes

A = ReplicaState.ACTIVE
H = tuple(range(1, 11))


def load(rid, hbm=(), host=(), waiting=0):
    return ReplicaLoad(rid, A, waiting=waiting, cached_prefixes=frozenset(hbm), host_prefixes=frozenset(host))


def test_the_host_run_continues_the_hbm_run_through_either_tier():
    assert tiered_blocks(H, frozenset(H[:3]), frozenset(H[2:6])) == (3, 3)
    assert tiered_blocks(H, frozenset(), frozenset(H[1:])) == (0, 0)  # the head is missing
    assert tiered_blocks(H, frozenset(H[:2]), frozenset()) == (2, 0)


def test_a_long_host_run_beats_a_short_hbm_one_and_value_zero_ignores_the_tier():
    loads = [load("hbm", hbm=H[:3]), load("host", host=H[:8])]
    d = choose(loads, RouteRequest(160, 8, prefix_hashes=H, host_block_value=0.9))
    assert d.ranked[0] == "host" and "+8 in its host tier" in d.reason
    assert choose(loads, RouteRequest(160, 8, prefix_hashes=H)).ranked[0] == "hbm"


def test_at_equal_runs_hbm_wins_over_the_host_tier():
    loads = [load("host", host=H[:5]), load("hbm", hbm=H[:5], waiting=1)]
    assert choose(loads, RouteRequest(160, 8, prefix_hashes=H, host_block_value=0.9)).ranked[0] == "hbm"


def test_recent_prefixes_forget_a_prefix_tail_first():
    mem = RecentPrefixes(4)
    mem.remember((1, 2, 3))
    mem.remember((7, 8))
    assert set(mem.keys()) == {1, 2, 7, 8} and len(mem) == 4
