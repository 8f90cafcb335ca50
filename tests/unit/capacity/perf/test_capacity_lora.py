"""LoRA in the simulated engine (issue 25): adapter loads cost the step that first uses them,
a step runs at most `max_loras` distinct adapters (others wait, as vLLM skips them), and LoRA
slows every step by `step_factor`."""

from __future__ import annotations

import pytest

from hbmserve.capacity.perf.engine_core import EngineConfig, EngineCore, SimRequest
from hbmserve.capacity.perf.hardware import get_gpu
from hbmserve.capacity.perf.lora import AdapterTiers, LoraCost, adapter_bytes, lora_cost
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment, cost_model

DEP = Deployment(load_model_shape("llama-3.1-8b"), get_gpu("h100-sxm"))
COST = cost_model(DEP)


def core(lora: LoraCost | None) -> EngineCore:
    return EngineCore(EngineConfig(num_blocks=4096, max_num_seqs=64, max_num_batched_tokens=2048,
                                   max_model_len=4096, lora=lora), COST)


def test_adapter_size_by_hand_for_llama_8b_rank_16():
    # 32 layers; q and o: 4096 -> 4096; k and v: 4096 -> 1024; A and B: rank x (in + out); bf16.
    per_layer = 16 * ((4096 + 4096) * 2 + (4096 + 1024) * 2)
    assert adapter_bytes(DEP.model, 16) == per_layer * 32 * 2
    c = lora_cost(DEP, 4, None, 16)
    assert c.max_cpu_loras == 4 and c.storage_load_s > c.host_load_s > 0


def test_tiers_count_loads_and_keep_busy_adapters():
    t = AdapterTiers(LoraCost(max_loras=1, max_cpu_loras=2, storage_load_s=1.0, host_load_s=0.1))
    assert t.acquire("a") == pytest.approx(1.1)  # storage, then a GPU slot
    assert not t.can_run("b"), "the one GPU slot runs a"
    t.release("a")
    assert t.can_run("b") and t.acquire("b") == pytest.approx(1.1)
    t.release("b")
    assert t.acquire("a") == pytest.approx(0.1), "a stayed in the host cache: only the copy"
    t.release("a")
    t.acquire("c")
    assert t.loads == 3 and t.evictions == 1 and "b" not in t.host
    # Per adapter: a loaded once from storage, then copied back into the GPU slot once more.
    assert t.loads_by == {"a": 1, "b": 1, "c": 1}
    assert t.load_s_by["a"] == pytest.approx(1.1 + 0.1) and t.load_s_by["c"] == pytest.approx(1.1)


def test_one_slot_runs_two_adapters_one_after_the_other_and_the_base_model_alongside():
    c = core(LoraCost(max_loras=1, max_cpu_loras=2, storage_load_s=0.5, host_load_s=0.0, step_factor=1.0))
    reqs = [SimRequest(0, 0.0, 100, 4, adapter="a"), SimRequest(1, 0.0, 100, 4, adapter="b"),
            SimRequest(2, 0.0, 100, 4)]
    for r in reqs:
        assert c.add(r)
    first = c.plan()
    assert {r.rid for r, _ in first.chunks} == {0, 2}, "b waits for the slot; the base request does not"
    assert first.total_s >= 0.5, "the step that first uses a waits for its load"
    t, done = 0.0, []
    while c.has_work():
        p = c.plan()
        t += p.total_s
        done += c.commit(p, p.steps, t)
    by = {r.rid: r for r in done}
    assert by[1].first_token_t > by[0].finish_t - 1e-9, "b started once a's request left the slot"
    assert c.lora.loads == 2


def test_lora_slows_each_step_by_its_factor():
    def one(lora):
        c = core(lora)
        c.add(SimRequest(0, 0.0, 500, 50))
        t = 0.0
        while c.has_work():
            p = c.plan()
            t += p.total_s
            c.commit(p, p.steps, t)
        return t
    slow = LoraCost(max_loras=1, max_cpu_loras=1, storage_load_s=0.0, host_load_s=0.0, step_factor=1.25)
    assert one(slow) == pytest.approx(1.25 * one(None))
