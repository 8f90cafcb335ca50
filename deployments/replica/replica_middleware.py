"""ASGI middleware in front of a replica's OpenAI app: the internal token, a per-replica
admission cap, load counters, the LoRA adapters it registers on demand, and the load report
(/hbm/load) and engine metrics (/hbm/metrics, engine_metrics.py) the front door reads.

Only the front door (front_door.py) talks to a replica. It authenticates clients, admits and
routes; it proves itself to the replica with the deployment's internal token, so a replica port
reached directly (it listens on the node's address) serves nothing but `/health`. The cap here is
a safety net for when several front doors' views of a replica lag; the front door's own
admission (routing/queue.py) is what clients meet.

Written as raw ASGI (not Starlette's BaseHTTPMiddleware) because it sits on every streamed
chunk of the data path; it adds one dict lookup and two counters per request.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping

from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric

from hbmserve.capacity.perf.lora import place_adapter
from hbmserve.core.records import AdapterHolding, LoadReport
from hbmserve.routing.replica_cap import AdmissionBudget, Reject, AdmissionLoad, admit_to_replica
from hbmserve.deployments.wire.engine_metrics import METRICS_PATH, exposition
from hbmserve.deployments.wire.http import ADAPTER_HEADER, INTERNAL_TOKEN_HEADER, LOAD_PATH, json_response, openai_error, request_lengths
from hbmserve.deployments.replica.replica_http import EngineLoad
from hbmserve.deployments.replica.standby_sleep import AwakeGate

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
log = logging.getLogger("hbmserve.deployments.replica")

# The paths that run the model (the front door admits the same, front_door_app.RUN_PATHS); the
# rest (/v1/models, /tokenize, /health) are always served.
ADMITTED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/invocations", "/v1/embeddings"})
_WINDOW_S = 30.0
# Fewer body chunks than this is a whole (non-streamed) reply or too short to time decoding.
_MIN_TPOT_CHUNKS = 4
_SSE_DONE = b"data: [DONE]\n\n"


@dataclass
class LoadCounters:
    """Mutable per-replica counters; read by the replica's stats methods."""

    in_flight: int = 0
    accepted: int = 0
    rejected: int = 0
    arrived: deque[float] = field(default_factory=deque)  # admission times
    finished: deque[float] = field(default_factory=deque)  # completion times
    first_byte_s: deque[tuple[float, float]] = field(default_factory=deque)  # (at, seconds)
    # (at, seconds per output token) of streamed replies: the gap between the first and last
    # body chunk over the chunks between, one token per chunk as vLLM (stream interval 1) and
    # the simulator stream. The final usage chunk counts as one more: ~1/n low for n tokens.
    tpot_s: deque[tuple[float, float]] = field(default_factory=deque)
    # (at, prompt tokens, output tokens) of finished requests (`request_lengths`): the length mix
    # the autoscaling policy re-estimates the replica's capacity for.
    lengths: deque[tuple[float, int, int]] = field(default_factory=deque)

    def trim(self, now: float) -> None:
        while self.arrived and self.arrived[0] < now - _WINDOW_S:
            self.arrived.popleft()
        while self.finished and self.finished[0] < now - _WINDOW_S:
            self.finished.popleft()
        for samples in (self.first_byte_s, self.tpot_s, self.lengths):
            while samples and samples[0][0] < now - _WINDOW_S:
                samples.popleft()

    def completion_rate(self, now: float) -> float | None:
        self.trim(now)
        return len(self.finished) / _WINDOW_S if self.finished else None

    def arrival_rate(self, now: float) -> float:
        self.trim(now)
        return len(self.arrived) / _WINDOW_S

    def ttft_samples(self, now: float) -> tuple[float, ...]:
        self.trim(now)
        return tuple(s for _, s in self.first_byte_s)

    def tpot_samples(self, now: float) -> tuple[float, ...]:
        self.trim(now)
        return tuple(s for _, s in self.tpot_s)

    def length_means(self, now: float) -> tuple[float, float, int] | None:
        """(mean prompt tokens, mean output tokens, requests) over the window; None if none."""
        self.trim(now)
        n = len(self.lengths)
        if not n:
            return None
        return sum(p for _, p, _ in self.lengths) / n, sum(o for _, _, o in self.lengths) / n, n


# ---- LoRA adapters, registered on demand (issue 25) ----
# A replica starts with no adapter registered. The front door names the adapter a request uses
# in a header (ADAPTER_HEADER); before the request reaches the engine the replica registers it if
# it must, through the engine's own adapter API (for vLLM the handler behind
# /v1/load_lora_adapter, called in process: vllm_server.vllm_adapter_calls), first unregistering
# the least recently used idle adapter when its slots (`lora.max_cpu_loras`, else `max_loras`) are
# full: `place_adapter`, the rule the simulated engine keeps its slots by too
# (capacity/perf/lora.py). An adapter some request is using is never unregistered; when all are
# in use the replica registers one more rather than refuse, and the set shrinks back as they go
# idle. The load report tells the doors which adapters it holds, so they route to it
# (routing/choose.py).

Load = Callable[[str, str], Awaitable[None]]  # (name, local path); raises AdapterLoadError
Unload = Callable[[str], Awaitable[None]]


class AdapterLoadError(RuntimeError):
    """The engine could not load an adapter; the message says which and why."""


class AdapterRegistry:
    def __init__(self, sources: Mapping[str, str], slots: int, load: Load, unload: Unload) -> None:
        """`sources`: each adapter's local folder (resolved through the weight cache)."""
        self.sources = dict(sources)
        self.slots = slots
        self._load, self._unload = load, unload
        self.resident: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self.busy: Counter[str] = Counter()
        self.loads: Counter[str] = Counter()
        self.unloads: Counter[str] = Counter()
        self._lock = asyncio.Lock()  # one load or unload at a time: they change the set

    async def acquire(self, name: str) -> None:
        """A request using `name` is about to run: have it registered. Pair with `release`."""
        if name not in self.sources:
            raise AdapterLoadError(f"adapter {name} is not one of this model's adapters")
        self.busy[name] += 1  # in use from now on: never evicted while this request waits
        try:
            if name in self.resident:
                self.resident.move_to_end(name)
                return
            async with self._lock:
                plan = place_adapter(name, tuple(self.resident), self.busy, self.slots, overcommit=True)
                for idle in plan.evict:
                    await self._unload(idle)
                    del self.resident[idle]
                    self.unloads[idle] += 1
                if not plan.resident:
                    await self._load(name, self.sources[name])
                    self.loads[name] += 1
                    log.info("%s", plan.reason)
                self.resident[name] = None
                self.resident.move_to_end(name)
        except BaseException:
            self.release(name)
            raise

    def holding(self) -> AdapterHolding:
        return AdapterHolding(resident=tuple(self.resident), slots=self.slots, loads=tuple(sorted(self.loads.items())),
                              unloads=tuple(sorted(self.unloads.items())))

    def release(self, name: str) -> None:
        self.busy[name] -= 1
        if self.busy[name] <= 0:
            del self.busy[name]


class ReplicaMiddleware:
    def __init__(self, app: ASGIApp, budget: AdmissionBudget, internal_token: str, counters: LoadCounters,
                 engine_stats: Callable[[], EngineLoad], engine_metrics: Callable[[], list[Metric]] = list,
                 awake: AwakeGate | None = None, routes: Mapping[str, ASGIApp] | None = None,
                 adapters: AdapterRegistry | None = None):
        self.app = app
        # The server's own internal paths (the doors' KV event stream, the tokenizer): behind the token.
        self.routes = dict(routes or {})
        self.budget = budget
        self.token = internal_token.encode()
        self.counters = counters
        self.engine_stats = engine_stats
        self.engine_metrics = engine_metrics
        self.awake = awake
        self.adapters = adapters

    def _load_report(self) -> LoadReport:
        load, c = self.engine_stats(), self.counters
        return LoadReport(waiting=load.waiting, running=load.running, kv_usage=load.kv_usage,
                          in_flight=c.in_flight, accepted=c.accepted, rejected=c.rejected,
                          prompt_tokens=load.prompt_tokens, prefix_hit_tokens=load.prefix_hit_tokens,
                          adapters=self.adapters.holding() if self.adapters else AdapterHolding())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] == "/health":
            await self.app(scope, receive, send)
            return
        presented = dict(scope["headers"]).get(INTERNAL_TOKEN_HEADER, b"")
        if not hmac.compare_digest(presented, self.token):
            for msg in openai_error(403, "Replicas serve only the hbmserve front door; send requests to its "
                                    "endpoint.", "permission_error", "not_front_door"):
                await send(msg)
            return
        if scope["path"] == LOAD_PATH:
            for msg in json_response(200, self._load_report().to_dict()):
                await send(msg)
            return
        if scope["path"] == METRICS_PATH:
            body = exposition(self.engine_metrics())
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", CONTENT_TYPE_LATEST.encode()),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        if scope["path"] in self.routes:
            await self.routes[scope["path"]](scope, receive, send)
            return
        adapter = dict(scope["headers"]).get(ADAPTER_HEADER)
        if adapter is not None:  # the door's word: this request runs with that adapter
            await self._with_adapter(adapter.decode("latin-1"), scope, receive, send)
            return
        await self._engine_call(scope, receive, send)

    async def _with_adapter(self, name: str, scope: Scope, receive: Receive, send: Send) -> None:
        if self.adapters is None:
            for msg in openai_error(404, f"The model `{name}` does not exist.", "invalid_request_error",
                                    "model_not_found"):
                await send(msg)
            return
        try:
            await self.adapters.acquire(name)
        except AdapterLoadError as err:
            for msg in openai_error(503, str(err), "server_error", "adapter_load_failed"):
                await send(msg)
            return
        try:
            await self._engine_call(scope, receive, send)
        finally:
            self.adapters.release(name)

    async def _engine_call(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] not in ADMITTED_PATHS:
            await self.app(scope, receive, send)
            return
        c = self.counters
        now = time.monotonic()
        decision = admit_to_replica(AdmissionLoad(c.in_flight, c.completion_rate(now)), self.budget)
        if isinstance(decision, Reject):
            c.rejected += 1
            retry = [(b"retry-after", str(decision.retry_after_s).encode())]
            for msg in openai_error(429, decision.reason, "rate_limit_error", "overloaded", retry):
                await send(msg)
            return
        c.in_flight += 1
        c.accepted += 1
        c.arrived.append(now)
        chunks, first_at, last_at = 0, now, now
        status, request_bytes, last_body = 0, 0, b""

        async def counting_receive() -> dict[str, Any]:
            nonlocal request_bytes
            message = await receive()
            request_bytes += len(message.get("body", b""))
            return message

        async def counting_send(message: dict[str, Any]) -> None:
            nonlocal chunks, first_at, last_at, status, last_body
            if message["type"] == "http.response.start":
                status = message["status"]
            body = message.get("body") if message["type"] == "http.response.body" else None
            if body and body != _SSE_DONE:  # the end marker comes with no token
                last_at = time.monotonic()
                last_body = body
                if chunks == 0:
                    first_at = last_at
                    c.first_byte_s.append((last_at, last_at - now))
                chunks += 1
            await send(message)

        try:
            if self.awake is not None:
                # While the engine sleeps (a standby, or one promoted and waking) the request
                # waits here, in flight, and its wait counts in its TTFT (standby_sleep.py).
                await self.awake.pass_through()
            await self.app(scope, counting_receive, counting_send)
        finally:
            c.in_flight -= 1
            done = time.monotonic()
            c.finished.append(done)
            if chunks >= _MIN_TPOT_CHUNKS:
                c.tpot_s.append((done, (last_at - first_at) / (chunks - 1)))
            if status == 200:
                c.lengths.append((done, *request_lengths(last_body, request_bytes, chunks)))
