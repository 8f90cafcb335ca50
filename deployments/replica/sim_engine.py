"""A simulated engine for the serving deployment: a virtual GPU that streams tokens at the pace
the performance model predicts, on asyncio, with no Ray and no model.

It runs the same scheduler as the simulator (`EngineCore`), one step at a time, sleeping each
step's modelled duration divided by `speedup`. Token *indices* are streamed (0, 1, 2, ...); the
caller turns them into text. Stats have vLLM's shape: waiting, running, KV usage, recent TTFTs,
and the prefix-cache counters (prompt tokens, of which read from cache). With prefix caching on,
the caller passes each prompt's block hashes (routing/prefix.py) and the engine's cache hits are
real: a request that shares blocks with an earlier one skips their prefill.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from hbmserve.capacity.perf.engine_core import EngineConfig, EngineCore, SimRequest
from hbmserve.capacity.perf.perf_model import Deployment, cost_model
from hbmserve.core.kv_events import KvEvent

_END = -1


class RequestRejected(ValueError):
    """The request cannot fit the engine's max_model_len (vLLM answers 400 for this)."""


@dataclass(frozen=True)
class EngineStats:
    waiting: int
    running: int
    kv_usage: float  # fraction of KV blocks in use, 0..1
    ttft_samples_s: tuple[float, ...]  # wall-clock TTFTs that completed in the last window
    num_preemptions: int
    num_finished: int
    ready: bool
    speedup: float  # virtual seconds per wall second (modelled TTFT = wall TTFT * speedup)
    prompt_tokens: int = 0  # of accepted requests (vLLM's prefix_cache_queries)
    prefix_hit_tokens: int = 0  # of those, read from the prefix cache (vLLM's prefix_cache_hits)


class SimEngine:
    def __init__(self, deployment: Deployment, config: EngineConfig, speedup: float = 1.0,
                 startup_s: float = 0.0, ttft_window_s: float = 60.0,
                 kv_sink: Callable[[tuple[KvEvent, ...]], None] | None = None) -> None:
        """`kv_sink`: takes each step's KV events (sim_kv.py), for a `config` that publishes them."""
        if speedup <= 0:
            raise ValueError("speedup must be > 0")
        self.core = EngineCore(config, cost_model(deployment))
        self.kv_sink = kv_sink
        self.speedup, self.startup_s, self.window_s = speedup, startup_s, ttft_window_s
        self._ids = itertools.count()
        self._streams: dict[int, tuple[SimRequest, asyncio.Queue[int], list[int]]] = {}
        self._names: dict[str, int] = {}
        self._aborts: set[int] = set()
        self._ttfts: deque[tuple[float, float]] = deque()
        self._finished = 0
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._ready: asyncio.Event | None = None
        self._t0 = 0.0

    # ---- lifecycle ----
    def start(self) -> None:
        """Start the step loop on the running event loop (generate() also starts it lazily)."""
        if self._task is None:
            loop = asyncio.get_running_loop()
            self._t0 = loop.time()
            self._wake, self._ready = asyncio.Event(), asyncio.Event()
            self._task = loop.create_task(self._run())

    async def wait_ready(self) -> None:
        self.start()
        assert self._ready is not None
        await self._ready.wait()

    async def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for _, q, _ in self._streams.values():
            q.put_nowait(_END)

    def _wall(self) -> float:
        return asyncio.get_running_loop().time() - self._t0

    # ---- requests ----
    async def generate(self, request_id: str, prompt_token_count: int, max_tokens: int,
                       prefix_hashes: tuple[int, ...] = (), adapter: str | None = None,
                       preloaded: int = 0) -> AsyncIterator[int]:
        """Yield output token indices 0..max_tokens-1 as the virtual GPU produces them.
        `prefix_hashes`: the prompt's block hashes, each naming `hash_block_tokens` tokens;
        `adapter`: the LoRA adapter it runs with (its loads and slots are modelled);
        `preloaded`: prompt tokens whose KV a prefill replica computed (not computed here)."""
        self.start()
        if request_id in self._names:
            raise ValueError(f"request id {request_id!r} is already running")
        rid = next(self._ids)
        req = SimRequest(rid, self._wall() * self.speedup, prompt_token_count, max_tokens, prefix_hashes, adapter)
        req.preloaded = preloaded
        if not self.core.add(req):
            raise RequestRejected(
                f"prompt ({prompt_token_count}) + max_tokens ({max_tokens}) exceeds max_model_len "
                f"({self.core.cfg.max_model_len})")
        q: asyncio.Queue[int] = asyncio.Queue()
        self._streams[rid] = (req, q, [0])
        self._names[request_id] = rid
        assert self._wake is not None
        self._wake.set()
        done = False
        try:
            while True:
                i = await q.get()
                if i == _END:
                    done = True
                    return
                yield i
        finally:
            self._names.pop(request_id, None)
            if not done and rid in self._streams:
                self._aborts.add(rid)  # the client went away: free its slot after this step
                self._streams.pop(rid, None)

    def abort(self, request_id: str) -> None:
        rid = self._names.pop(request_id, None)
        if rid is None:
            return
        entry = self._streams.pop(rid, None)
        self._aborts.add(rid)
        if entry is not None:
            entry[1].put_nowait(_END)

    def stats(self) -> EngineStats:
        if self._task is not None:
            horizon = self._wall() - self.window_s
            while self._ttfts and self._ttfts[0][0] < horizon:
                self._ttfts.popleft()
        return EngineStats(
            waiting=self.core.num_waiting, running=self.core.num_running, kv_usage=self.core.kv_usage(),
            ttft_samples_s=tuple(s for _, s in self._ttfts), num_preemptions=self.core.preemptions,
            num_finished=self._finished, ready=self._ready is not None and self._ready.is_set(),
            speedup=self.speedup, prompt_tokens=self.core.prompt_tokens, prefix_hit_tokens=self.core.prefix_hit_tokens)

    # ---- the step loop ----
    async def _run(self) -> None:
        assert self._wake is not None and self._ready is not None
        if self.startup_s > 0:
            await asyncio.sleep(self.startup_s / self.speedup)
        self._ready.set()
        while True:
            self._apply_aborts()
            plan = self.core.plan(max_steps=1)
            if plan is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            await asyncio.sleep(plan.total_s / self.speedup)
            finished = self.core.commit(plan, 1, self._wall() * self.speedup)
            if self.kv_sink is not None:
                self.kv_sink(self.core.take_kv_events())
            self._emit(finished)

    def _apply_aborts(self) -> None:
        for rid in self._aborts:
            self.core.abort(rid)
        self._aborts.clear()

    def _emit(self, finished: list[SimRequest]) -> None:
        wall = self._wall()
        done = {r.rid for r in finished}
        for rid, (req, q, sent) in list(self._streams.items()):
            n = req.max_tokens if rid in done else self.core.generated(req)
            if n > sent[0] and sent[0] == 0:
                self._ttfts.append((wall, wall - req.arrival / self.speedup))
            for i in range(sent[0], n):
                q.put_nowait(i)
            sent[0] = n
            if rid in done:
                q.put_nowait(_END)
                del self._streams[rid]
                self._finished += 1
