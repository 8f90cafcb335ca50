"""Sizing the host KV tier (capacity/planning/host_tier.py): the simulator's fleet search per size,
priced as GPU-hours plus host GiB-hours, and a reason that says whether the tier pays."""

from __future__ import annotations

import dataclasses

import pytest

from hbmserve.capacity.perf.engine_core import EngineConfig
from hbmserve.capacity.perf.hardware import get_gpu
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment
from hbmserve.capacity.planning.host_tier import TierOption, _pick, size_host_tier
from hbmserve.capacity.traces.prefix_trace import PrefixTraceSpec, prefix_arrivals
from hbmserve.core.config import SloSeconds

DEP = Deployment(load_model_shape("llama-3.1-8b"), get_gpu("h100-sxm"), tp=1)
# A short HBM (about 10k tokens of cache a replica): sessions come back after it let go of them.
ENG = EngineConfig(num_blocks=1200, max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=8192,
                   enable_prefix_caching=True, hash_block_tokens=64)
TRACE = prefix_arrivals(PrefixTraceSpec(duration_s=120, session_rps=1.0, system_prompts=20, think_s=20,
                                        user_tokens=600, max_context_tokens=8192, block_tokens=64), seed=3)
SLO = SloSeconds(2.0, 0.1)


def plan(usd_per_gib_hour: float):
    return size_host_tier(DEP, ENG, SLO, TRACE, 2, usd_per_gpu_hour=3.0, usd_per_gib_hour=usd_per_gib_hour,
                          sizes_gib=(0, 2, 16))


def test_each_size_is_simulated_and_priced_and_the_cheapest_that_meets_the_slo_wins():
    free, dear = plan(0.0), plan(100.0)
    assert [o.host_gib for o in free.options] == [0, 2, 16]
    hits = [o.prefix_hit_rate for o in free.options]
    assert hits[0] < hits[1] < hits[2] and free.options[0].host_hit_rate == 0 < free.options[2].host_hit_rate
    for o in free.options:  # the cost is derived from the run, not estimated apart
        assert o.usd == pytest.approx(o.gpu_hours * 3.0)
        assert o.host_gib_hours == pytest.approx(o.host_gib * o.gpu_hours)  # one GPU a replica
    assert free.best.usd == min(o.usd for o in free.options if o.meets_slo)
    # Memory at $100 a GiB-hour never pays: the same runs, the verdict flips to no tier.
    assert [o.replicas for o in dear.options] == [o.replicas for o in free.options]
    assert dear.best.host_gib == 0 and dear.reason.startswith("no tier")


def _opt(gib: float, replicas: int, ok: bool, usd: float) -> TierOption:
    return TierOption(gib, replicas, ok, 0.1, 0.0, 1.0, gpu_hours=replicas * 1.0, host_gib_hours=gib * replicas, usd=usd)


def test_the_reason_says_what_the_tier_saves_or_why_there_is_none():
    best, why = _pick([_opt(0, 10, True, 30.0), _opt(256, 8, True, 27.0)])
    assert best.host_gib == 256
    assert why == "256 GiB per replica pays: 8 replicas instead of 10, 2.0 GPU-h saved for 2,048 GiB-h of host memory, $3.00 less over the trace"
    best, why = _pick([_opt(0, 12, False, 36.0), _opt(64, 9, True, 40.0)])
    assert best.host_gib == 64 and "without a tier no replica count tried meets the SLO" in why
    best, why = _pick([_opt(0, 12, False, 36.0), _opt(64, 12, False, 40.0)])
    assert best.host_gib == 0 and why.startswith("no size meets the SLO")


def test_a_tier_needs_prefix_caching_and_sane_inputs():
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        size_host_tier(DEP, dataclasses.replace(ENG, enable_prefix_caching=False), SLO, TRACE, 2, 3.0)
    with pytest.raises(ValueError, match=">= 0 GiB"):
        size_host_tier(DEP, ENG, SLO, TRACE, 2, 3.0, sizes_gib=(-1,))
