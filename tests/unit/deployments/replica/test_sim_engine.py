"""The asyncio simulated engine: pacing, streaming, abort, stats, start-up delay (virtual speed-up)."""

from __future__ import annotations

import asyncio

import pytest

from hbmserve.capacity.perf.engine_core import EngineConfig
from hbmserve.capacity.perf.hardware import get_gpu
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment, cost_model
from hbmserve.deployments.replica.sim_engine import RequestRejected, SimEngine

DEP = Deployment(load_model_shape("llama-3.1-70b"), get_gpu("h100-sxm"), tp=4)
CFG = EngineConfig(num_blocks=10_000, max_num_seqs=16, max_num_batched_tokens=2048, max_model_len=4096)
SPEEDUP = 20.0


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=20))


def test_streams_every_token_index_in_order_at_the_modelled_pace():
    async def main():
        eng = SimEngine(DEP, CFG, speedup=SPEEDUP)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        toks, first = [], None
        async for i in eng.generate("a", 1000, 40):
            first = first if first is not None else loop.time() - t0
            toks.append(i)
        total = loop.time() - t0
        await eng.shutdown()
        return toks, first, total, eng.stats()

    toks, first, total, stats = run(main())
    cost = cost_model(DEP)
    prefill = float(cost.step_time(0, 0.0, 1000, 1000 * 1001 / 2, 1000, 1))
    decode = sum(float(cost.step_time(1, 1001 + j)) for j in range(39))
    assert toks == list(range(40))
    assert first == pytest.approx(prefill / SPEEDUP, abs=0.05)
    assert total == pytest.approx((prefill + decode) / SPEEDUP, rel=0.3, abs=0.05)
    assert stats.num_finished == 1 and stats.running == 0 and len(stats.ttft_samples_s) == 1


def test_concurrent_requests_batch_and_stats_show_load():
    async def main():
        eng = SimEngine(DEP, CFG, speedup=SPEEDUP)

        async def one(i):
            return [t async for t in eng.generate(f"r{i}", 200, 30)]

        tasks = [asyncio.create_task(one(i)) for i in range(20)]
        seen = []
        while not all(t.done() for t in tasks):
            seen.append(eng.stats())
            await asyncio.sleep(0.0005)
        outs = await asyncio.gather(*tasks)
        await eng.shutdown()
        return seen, outs, eng.stats()

    seen, outs, end = run(main())
    assert max(s.running for s in seen) == 16  # max_num_seqs caps the batch
    assert max(s.waiting for s in seen) >= 4
    assert max(s.kv_usage for s in seen) > 0
    assert all(o == list(range(30)) for o in outs)
    assert end.num_finished == 20 and end.kv_usage == 0.0


def test_abort_ends_the_stream_and_frees_the_slot():
    async def main():
        eng = SimEngine(DEP, CFG, speedup=SPEEDUP)
        got = []

        async def consume():
            async for t in eng.generate("x", 100, 1000):
                got.append(t)

        task = asyncio.create_task(consume())
        while len(got) < 3:
            await asyncio.sleep(0.005)
        eng.abort("x")
        await task
        await asyncio.sleep(0.05)
        s = eng.stats()
        await eng.shutdown()
        return got, s

    got, s = run(main())
    assert 3 <= len(got) < 1000
    assert s.running == 0 and s.waiting == 0


def test_start_up_delay_and_rejection():
    async def main():
        eng = SimEngine(DEP, CFG, speedup=SPEEDUP, startup_s=4.0)
        eng.start()
        assert not eng.stats().ready
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await eng.wait_ready()
        waited = loop.time() - t0
        with pytest.raises(RequestRejected, match="max_model_len"):
            async for _ in eng.generate("big", 4000, 200):
                pass
        await eng.shutdown()
        return waited

    assert run(main()) == pytest.approx(4.0 / SPEEDUP, abs=0.05)
