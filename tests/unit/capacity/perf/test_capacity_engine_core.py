"""The vLLM-V1-style scheduler: timelines, chunking, limits, preemption, prefix caching."""

from __future__ import annotations

import math

import pytest

from hbmserve.capacity.perf.kv_blocks import PrefixCache
from hbmserve.capacity.perf.engine_core import EngineConfig, EngineConfigError, EngineCore, SimRequest
from hbmserve.capacity.perf.hardware import get_gpu
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment, cost_model

COST = cost_model(Deployment(load_model_shape("llama-3.1-8b"), get_gpu("h100-sxm")))


def core(**kw) -> EngineCore:
    base = dict(num_blocks=4096, block_size=16, max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=4096)
    base.update(kw)
    return EngineCore(EngineConfig(**base), COST)


def drain(c: EngineCore, max_steps: int | None = None, t: float = 0.0) -> list[SimRequest]:
    done: list[SimRequest] = []
    while c.has_work():
        p = c.plan(max_steps)
        assert p is not None, "scheduler stalled with work queued"
        t += p.total_s
        done += c.commit(p, p.steps, t)
        assert c.used_blocks <= c.cfg.num_blocks
    return done


def test_single_request_timeline_by_hand():
    c = core()
    r = SimRequest(0, 0.0, 100, 5)
    assert c.add(r)
    (done,) = drain(c)
    t1 = float(COST.step_time(0, 0.0, 100, 100 * 101 / 2, 100, 1))
    # After the prefill the context is 101 tokens (prompt + first token) and grows by one per step.
    decode = sum(float(COST.step_time(1, 101 + j)) for j in range(4))
    assert done is r
    assert r.first_token_t == pytest.approx(t1)
    assert r.finish_t == pytest.approx(t1 + decode)
    assert c.tokens_processed == 100 + 4


def test_chunked_prefill_takes_ceil_prompt_over_budget_steps():
    c = core(max_num_batched_tokens=256)
    r = SimRequest(0, 0.0, 1000, 2)
    c.add(r)
    steps = 0
    while r.first_token_t is None:
        p = c.plan()
        assert [x for x, _ in p.chunks] == [r] and p.chunks[0][1] <= 256
        steps += 1
        c.commit(p, p.steps, float(steps))
    assert steps == math.ceil(1000 / 256)


def test_without_chunked_prefill_prompts_prefill_together_before_decodes():
    c = core(enable_chunked_prefill=False, max_num_batched_tokens=4096)
    a, b = SimRequest(0, 0.0, 1000, 3), SimRequest(1, 0.0, 1000, 3)
    c.add(a)
    c.add(b)
    p = c.plan()
    assert [r for r, _ in p.chunks] == [a, b] and p.n_dec == 0
    c.commit(p, 1, 1.0)
    assert a.first_token_t == b.first_token_t == 1.0


def test_max_num_seqs_caps_running():
    c = core(max_num_seqs=2)
    for i in range(5):
        c.add(SimRequest(i, 0.0, 50, 20))
    t = 0.0
    while c.has_work():
        p = c.plan()
        assert c.num_running <= 2
        t += p.total_s
        c.commit(p, p.steps, t)


def test_coalesced_decode_steps_match_step_by_step():
    reqs = [(i, 50 + 37 * i, 10 + 13 * i) for i in range(12)]

    def run(max_steps):
        c = core(max_num_seqs=8)
        rs = [SimRequest(i, 0.0, p, o) for i, p, o in reqs]
        for r in rs:
            c.add(r)
        drain(c, max_steps)
        return rs, c.steps

    coarse, steps_a = run(None)
    fine, steps_b = run(1)
    assert steps_a == steps_b
    for x, y in zip(coarse, fine):
        assert x.first_token_t == pytest.approx(y.first_token_t, rel=1e-9)
        assert x.finish_t == pytest.approx(y.finish_t, rel=1e-9)


def _kv_pressure(mode: str, swap_tokens: int = 0):
    c = core(num_blocks=40, max_model_len=640, max_num_batched_tokens=1024, preemption_mode=mode,
             swap_space_tokens=swap_tokens)
    rs = [SimRequest(i, 0.0, 100, 200) for i in range(4)]
    for r in rs:
        c.add(r)
    done = drain(c)
    return c, rs, done


def test_preemption_by_recompute_when_kv_runs_out():
    c, rs, done = _kv_pressure("recompute")
    assert sorted(r.rid for r in done) == [0, 1, 2, 3]
    assert c.preemptions > 0
    assert c.max_used_blocks <= 40
    assert all(r.generated == 200 for r in rs)
    # Recompute re-prefills the victims' context, so more tokens are processed than the minimum.
    assert c.tokens_processed > 4 * (100 + 199)


def test_preemption_by_swap_moves_kv_instead_of_recomputing():
    c, rs, done = _kv_pressure("swap", swap_tokens=10_000)
    assert len(done) == 4 and c.preemptions > 0
    assert c.tokens_processed == 4 * (100 + 199)


def test_swap_without_host_space_falls_back_to_recompute():
    c, _, done = _kv_pressure("swap", swap_tokens=0)
    assert len(done) == 4 and c.tokens_processed > 4 * (100 + 199)


def test_prefix_cache_skips_cached_blocks():
    c = core(enable_prefix_caching=True, hash_block_tokens=64)
    a = SimRequest(0, 0.0, 200, 2, hashes=(1, 2, 3, 4))
    c.add(a)
    drain(c)
    before = c.tokens_processed
    b = SimRequest(1, 0.0, 200, 2, hashes=(1, 2, 3, 4))
    c.add(b)
    drain(c)
    # 200 // 64 = 3 hashed blocks (192 tokens) are cached; only 8 prompt tokens are prefilled.
    assert c.tokens_processed - before == 8 + 1
    assert c.cache is not None and c.cache.hits == 3
    # The hit-rate counters: 400 prompt tokens accepted, 192 of them read from the cache.
    assert (c.prompt_tokens, c.prefix_hit_tokens) == (400, 192)
    assert set(c.cache.cached) == {1, 2, 3}


def test_a_released_prefix_is_evicted_tail_first_so_the_cache_stays_prefix_closed():
    cache = PrefixCache(blocks_per_hash=1)
    cache.acquire((1, 2, 3, 4))
    cache.release((1, 2, 3, 4))
    cache.evict(2)
    assert set(cache.cached) == {1, 2} and cache.match((1, 2, 3, 4)) == 2


def test_requests_over_max_model_len_are_rejected():
    c = core(max_model_len=512)
    assert not c.add(SimRequest(0, 0.0, 500, 20))
    assert c.add(SimRequest(1, 0.0, 400, 100))


def test_abort_frees_everything():
    c = core()
    for i in range(3):
        c.add(SimRequest(i, 0.0, 300, 50))
    p = c.plan()
    c.commit(p, p.steps, p.total_s)
    assert c.abort(1) is not None
    assert c.abort(99) is None
    drain(c)
    assert c.used_blocks == 0 and c.num_running == 0


def test_impossible_settings_raise():
    with pytest.raises(EngineConfigError, match="max_model_len"):
        EngineConfig(num_blocks=10, block_size=16, max_model_len=1024)
    with pytest.raises(EngineConfigError, match="chunked"):
        EngineConfig(num_blocks=1000, max_model_len=4096, max_num_batched_tokens=2048, enable_chunked_prefill=False)
