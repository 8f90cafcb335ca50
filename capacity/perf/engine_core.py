"""A vLLM-V1-style scheduler on a virtual clock, shared by the simulator and the sim engine.

One `EngineCore` is one replica's engine. `plan()` forms the next step the way vLLM V1 does
(running decodes first, then partial prefills, then waiting requests FCFS, under the token
budget, max_num_seqs and free KV blocks; preempting the newest request when KV runs out) and
returns its duration from the performance model. `commit()` applies it.

Speed comes from coalescing: while only decodes run and nothing changes, consecutive steps
differ only in context length, so one plan covers up to `max_coalesced_steps` of them (until the
first sequence finishes or KV would run out) and is costed in one vectorised call. Decode
sequences are kept as offsets from a global step counter `G`, so advancing k steps is O(1):
a sequence's generated tokens are `G - o`, its own KV tokens `G + c`, its context `G + d`.
"""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from hbmserve.capacity.perf.engine_types import EngineConfig, EngineConfigError, Plan, SimRequest
from hbmserve.capacity.perf.kv_blocks import PrefixCache, blocks_for
from hbmserve.capacity.perf.lora import AdapterTiers
from hbmserve.capacity.perf.perf_model import StepCostModel
from hbmserve.core.kv_events import KvEvent

__all__ = ["EngineConfig", "EngineConfigError", "EngineCore", "Plan", "SimRequest"]


class EngineCore:
    def __init__(self, cfg: EngineConfig, cost: StepCostModel) -> None:
        self.cfg, self.cost, self.B = cfg, cost, cfg.block_size
        self.waiting: deque[SimRequest] = deque()
        self.prefilling: list[SimRequest] = []
        self.decode: dict[int, SimRequest] = {}
        self._heap: list[tuple[int, int, int]] = []
        self.G = 0
        self._sum_d = 0
        self._c = np.zeros(0, dtype=np.int64)
        self._c_dirty = False
        self._decode_blocks = 0
        self._prefill_blocks = 0
        self._swap_used = 0
        self._admits = 0
        hb = blocks_for(cfg.hash_block_tokens, cfg.block_size)
        self.cache = (PrefixCache(hb, cfg.host_kv_tokens // cfg.hash_block_tokens, cfg.publish_kv_events)
                      if cfg.enable_prefix_caching else None)
        self.preemptions = 0
        self.steps = 0
        self.busy_s = 0.0
        self.tokens_processed = 0
        self.max_used_blocks = 0
        # Prompt tokens of accepted requests, and those of them read from the prefix cache
        # instead of computed (vLLM's prefix_cache_queries / prefix_cache_hits, counted once per
        # request: a preempted request recomputes without a cache lookup).
        self.prompt_tokens = 0
        self.prefix_hit_tokens = 0
        # Of those, loaded from the host tier rather than found in HBM; and loads not yet costed.
        self.host_hit_tokens = 0
        self._host_load_tokens = 0
        self.lora = AdapterTiers(cfg.lora) if cfg.lora is not None else None
        self._step_factor = cfg.lora.step_factor if cfg.lora is not None else 1.0
        self._lora_load_s = 0.0  # adapter loads of this step's admissions, not yet costed

    # ---- state ----
    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decode)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.prefilling) + len(self.decode)

    @property
    def used_blocks(self) -> int:
        cached = self.cache.total_blocks if self.cache else 0
        return self._decode_blocks + self._prefill_blocks + cached

    def generated(self, r: SimRequest) -> int:
        """Output tokens a request has produced so far."""
        return self.G - r.o if r.rid in self.decode else r.generated

    def kv_usage(self) -> float:
        cached = self.cache.referenced_blocks if self.cache else 0
        return (self._decode_blocks + self._prefill_blocks + cached) / self.cfg.num_blocks

    def _avail(self) -> int:
        evictable = self.cache.evictable_blocks if self.cache else 0
        return self.cfg.num_blocks - self.used_blocks + evictable

    def _ensure_free(self, n: int) -> None:
        short = n - (self.cfg.num_blocks - self.used_blocks)
        if short > 0 and self.cache:
            self.cache.evict(short)

    def _c_array(self) -> np.ndarray:
        if self._c_dirty:
            self._c = np.fromiter((r.c for r in self.decode.values()), dtype=np.int64, count=len(self.decode))
            self._c_dirty = False
        return self._c

    def _blocks_at(self, g: int) -> int:
        c = self._c_array()
        return int(((g + c + (self.B - 1)) // self.B).sum()) if len(c) else 0

    # ---- requests in and out ----
    def add(self, req: SimRequest) -> bool:
        """Queue a request; False (rejected, as vLLM answers 400) when it cannot fit max_model_len."""
        if req.prompt + req.max_tokens > self.cfg.max_model_len:
            return False
        self.waiting.append(req)
        self.prompt_tokens += req.prompt
        return True

    def abort(self, rid: int) -> SimRequest | None:
        for r in self.waiting:
            if r.rid == rid:
                self.waiting.remove(r)
                self._swap_used -= r.swapped_tokens
                return r
        for r in self.prefilling:
            if r.rid == rid:
                self.prefilling.remove(r)
                self._prefill_blocks -= r.own_blocks
                self._release(r)
                return r
        r = self.decode.pop(rid, None)
        if r is not None:
            self._leave_decode(r)
            self._release(r)
        return r

    def _release(self, r: SimRequest) -> None:
        """`r` stops running (finished, aborted or preempted)."""
        if self.cache and r.held:
            self.cache.release(r.held)
        r.held = ()
        if self.lora is not None and r.adapter is not None:
            self.lora.release(r.adapter)

    def _start_running(self, r: SimRequest) -> None:
        if self.lora is not None and r.adapter is not None:
            self._lora_load_s += self.lora.acquire(r.adapter)

    def _leave_decode(self, r: SimRequest) -> None:
        r.generated = self.G - r.o
        self._sum_d -= r.d
        self._c_dirty = True
        self._decode_blocks = self._blocks_at(self.G)

    def _enter_decode(self, r: SimRequest, own_tokens: int, ctx_tokens: int) -> None:
        r.o = self.G - r.generated
        r.c = own_tokens - self.G
        r.d = ctx_tokens - self.G
        r.finish_g = r.o + r.max_tokens
        self.decode[r.rid] = r
        self._sum_d += r.d
        self._c_dirty = True
        heapq.heappush(self._heap, (r.finish_g, r.admit_seq, r.rid))

    # ---- preemption ----
    def _preempt_one(self) -> float:
        """Preempt the most recently admitted running request; returns swap-out seconds."""
        victim = max([*self.prefilling, *self.decode.values()], key=lambda r: r.admit_seq)
        self.preemptions += 1
        victim.preemptions += 1
        seconds = 0.0
        if victim.rid in self.decode:
            ctx = self.G + victim.d
            del self.decode[victim.rid]
            self._leave_decode(victim)
            if self.cfg.preemption_mode == "swap" and self._swap_used + ctx <= self.cfg.swap_space_tokens:
                victim.swapped_tokens = ctx
                self._swap_used += ctx
                seconds = self.cost.swap_time(ctx)
        else:
            self.prefilling.remove(victim)
            self._prefill_blocks -= victim.own_blocks
        self._release(victim)
        # Cached prefixes are not re-matched after a preemption: the victim recomputes (or swaps in)
        # its whole context as its own blocks.
        victim.hashes, victim.hashed_tokens, victim.own_blocks = (), 0, 0
        victim.preloaded = 0  # its transferred KV is gone with its blocks: recomputed here
        if not victim.swapped_tokens:
            victim.computed, victim.target = 0, victim.prompt + victim.generated
        self.waiting.appendleft(victim)
        return seconds

    # ---- scheduling ----
    def plan(self, max_steps: int | None = None) -> Plan | None:
        if not self.has_work():
            return None
        extra = self._swap_ins()
        chunks: list[tuple[SimRequest, int]] = []
        if self.cfg.enable_chunked_prefill:
            extra += self._reserve_decode_growth()
            chunks = self._schedule_chunks(self.cfg.max_num_batched_tokens - len(self.decode),
                                           reserved=self._growth(1))
        elif self.waiting:
            # Without chunked prefill (vLLM V0), whole-prompt prefill steps run before decodes.
            chunks = self._schedule_chunks(self.cfg.max_num_batched_tokens, reserved=0, whole=True)
            if chunks:
                return self._make_plan(0, chunks, extra + self._host_loads())
        if chunks:
            return self._make_plan(len(self.decode), chunks, extra + self._host_loads())
        if not self.decode:
            return None
        return self._decode_plan(max_steps, extra)

    def _host_loads(self) -> float:
        """Seconds to copy the KV this step's admissions found in the host tier into HBM (the
        step waits for it; pessimistic: vLLM's connector loads while other requests run), and to
        load the adapters they use (vLLM loads them as it prepares the step)."""
        tokens, self._host_load_tokens = self._host_load_tokens, 0
        lora, self._lora_load_s = self._lora_load_s, 0.0
        return (self.cost.swap_time(tokens) if tokens else 0.0) + lora

    def take_kv_events(self) -> tuple[KvEvent, ...]:
        """The KV events recorded since the last call (empty unless publish_kv_events)."""
        if self.cache is None or not self.cache.events:
            return ()
        out = tuple(self.cache.events)
        self.cache.events.clear()
        return out

    def _growth(self, k: int) -> int:
        return self._blocks_at(self.G + k) - self._decode_blocks if self.decode else 0

    def _reserve_decode_growth(self) -> float:
        seconds = 0.0
        while self.decode and self._growth(1) > self._avail():
            seconds += self._preempt_one()
        return seconds

    def _swap_ins(self) -> float:
        seconds = 0.0
        while (self.waiting and self.waiting[0].swapped_tokens
               and self.num_running < self.cfg.max_num_seqs):
            r = self.waiting[0]
            need = blocks_for(r.swapped_tokens, self.B)
            if need > self._avail() - self._growth(1):
                break
            self.waiting.popleft()
            self._ensure_free(need)
            seconds += self.cost.swap_time(r.swapped_tokens)
            self._swap_used -= r.swapped_tokens
            self._admits += 1
            r.admit_seq = self._admits
            self._start_running(r)
            seconds += self._lora_load_s
            self._lora_load_s = 0.0
            self._enter_decode(r, r.swapped_tokens, r.swapped_tokens)
            r.swapped_tokens = 0
            self._decode_blocks = self._blocks_at(self.G)
        return seconds

    def _own_tokens(self, r: SimRequest, computed: int) -> int:
        return max(0, computed - r.hashed_tokens)

    def _chunk_blocks(self, r: SimRequest, chunk: int) -> int:
        """Own blocks a request holds after this chunk (plus the slot of its next token if final)."""
        done = r.computed + chunk
        return blocks_for(self._own_tokens(r, done) + (1 if done == r.target else 0), self.B)

    def _schedule_chunks(self, budget: int, reserved: int, whole: bool = False) -> list[tuple[SimRequest, int]]:
        chunks: list[tuple[SimRequest, int]] = []
        for r in self.prefilling:
            if budget <= 0:
                break
            c = min(r.target - r.computed, budget)
            delta = self._chunk_blocks(r, c) - r.own_blocks
            if delta > self._avail() - reserved:
                break
            self._ensure_free(delta)
            r.own_blocks += delta
            self._prefill_blocks += delta
            chunks.append((r, c))
            budget -= c
        no_slot: list[SimRequest] = []  # skipped: their adapter has no free GPU slot (as vLLM skips)
        while self.waiting and budget > 0 and self.num_running < self.cfg.max_num_seqs:
            r = self.waiting[0]
            if r.swapped_tokens:
                break
            if self.lora is not None and r.adapter is not None and not self.lora.can_run(r.adapter):
                no_slot.append(self.waiting.popleft())
                continue
            if not self._admit(r, budget, reserved, whole):
                break
            self.waiting.popleft()
            self.prefilling.append(r)
            c = min(r.target - r.computed, budget)
            chunks.append((r, c))
            budget -= c
        self.waiting.extendleft(reversed(no_slot))
        return chunks

    def _admit(self, r: SimRequest, budget: int, reserved: int, whole: bool) -> bool:
        hs: tuple[int, ...] = ()
        if self.cache is not None and r.hashes:
            usable = min(len(r.hashes), r.prompt // self.cfg.hash_block_tokens)
            hs = r.hashes[:usable]
        hits = self.cache.match(hs) if hs else 0
        loaded = self.cache.host_run(hs, hits) if hs else 0
        hashed = len(hs) * self.cfg.hash_block_tokens
        computed = min(max((hits + loaded) * self.cfg.hash_block_tokens, r.preloaded), r.target - 1)
        from_host = max(0, min(computed, loaded * self.cfg.hash_block_tokens + hits * self.cfg.hash_block_tokens)
                        - hits * self.cfg.hash_block_tokens)
        c = min(r.target - computed, budget)
        if whole and c < r.target - computed:
            return False
        own = blocks_for(max(0, computed + c - hashed) + (1 if computed + c == r.target else 0), self.B)
        new_entries = self.cache.new_blocks_needed(hs) if hs else 0
        pinned = self.cache.evictable_blocks_among(hs) if hs else 0
        if own + new_entries > self._avail() - pinned - reserved:
            return False
        if hs:
            self.cache.acquire(hs)
            r.held = hs
        r.hashed_tokens, r.computed = hashed, computed
        self.prefix_hit_tokens += min(computed, (hits + loaded) * self.cfg.hash_block_tokens)
        self.host_hit_tokens += from_host
        self._host_load_tokens += from_host
        self._ensure_free(own)
        r.own_blocks = own
        self._prefill_blocks += own
        self._admits += 1
        r.admit_seq = self._admits
        self._start_running(r)
        return True

    def _make_plan(self, n_dec: int, chunks: list[tuple[SimRequest, int]], extra: float) -> Plan:
        n_pre = pairs = kv = 0
        for r, c in chunks:
            s = r.computed
            n_pre += c
            pairs += c * s + c * (c + 1) // 2
            kv += s + c
        ctx = n_dec * self.G + self._sum_d if n_dec else 0
        t = float(self.cost.step_time(n_dec, float(ctx), n_pre, float(pairs), float(kv), len(chunks))) * self._step_factor + extra
        d = np.array([t])
        return Plan(d, d.copy(), n_dec, chunks)

    def _decode_plan(self, max_steps: int | None, extra: float) -> Plan | None:
        while self.decode:
            k = self.cfg.max_coalesced_steps
            if max_steps is not None:
                k = max(1, min(max_steps, k))
            while self._heap and (self._heap[0][2] not in self.decode
                                  or self.decode[self._heap[0][2]].finish_g != self._heap[0][0]):
                heapq.heappop(self._heap)
            k = min(k, self._heap[0][0] - self.G)
            k = self._max_growth_steps(self._avail(), k)
            if k > 0:
                n = len(self.decode)
                durs = self.cost.decode_step_times(n, float(n * self.G + self._sum_d), k) * self._step_factor
                durs[0] += extra
                return Plan(durs, np.cumsum(durs), n, [])
            extra += self._preempt_one()
        return None

    def _max_growth_steps(self, avail: int, k_cap: int) -> int:
        n = len(self.decode)
        safe = (avail // n) * self.B if n else k_cap
        if k_cap <= safe:
            return k_cap
        lo, hi = safe, k_cap
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._growth(mid) <= avail:
                lo = mid
            else:
                hi = mid - 1
        return lo

    # ---- applying a step ----
    def commit(self, plan: Plan, steps: int, t_end: float) -> list[SimRequest]:
        """Apply the first `steps` steps of a plan that end at `t_end`; returns finished requests."""
        steps = max(1, min(steps, plan.steps))
        finished: list[SimRequest] = []
        if plan.n_dec:  # a prefill-only step (no chunked prefill) does not advance decodes
            self.G += steps
        self.steps += steps
        self.busy_s += float(plan.cumulative[steps - 1])
        self.tokens_processed += plan.n_dec * steps
        for r, c in plan.chunks:
            self.tokens_processed += c
            r.computed += c
            if r.computed < r.target:
                continue
            self.prefilling.remove(r)
            self._prefill_blocks -= r.own_blocks
            r.generated += 1
            if r.first_token_t is None:
                r.first_token_t = t_end
            if r.generated >= r.max_tokens:
                self._finish(r, t_end, finished)
            else:
                own = self._own_tokens(r, r.target) + 1
                self._enter_decode(r, own, r.target + 1)
        while self._heap and self._heap[0][0] <= self.G:
            fg, _, rid = heapq.heappop(self._heap)
            r = self.decode.get(rid)
            if r is None or r.finish_g != fg:
                continue
            del self.decode[rid]
            self._sum_d -= r.d
            self._c_dirty = True
            r.generated = r.max_tokens
            self._finish(r, t_end, finished)
        self._decode_blocks = self._blocks_at(self.G)
        self._ensure_free(0)
        self.max_used_blocks = max(self.max_used_blocks, self.used_blocks)
        return finished

    def _finish(self, r: SimRequest, t_end: float, finished: list[SimRequest]) -> None:
        r.finish_t = t_end
        self._release(r)
        finished.append(r)
