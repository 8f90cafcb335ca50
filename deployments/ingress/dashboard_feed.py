"""The front door's side of the ops dashboard: what it measures, what it keeps, what it serves.

* `ReplyWatch` wraps the ASGI `send` of one generation request and times what is relayed to the
  client; `ReplyWindow` keeps those timings per model over a sliding window. This is the
  client-side view measured at the front door (time from the request's arrival at the door to
  the first relayed byte, gaps between relayed tokens), not the engines' own histograms: it
  includes the door's queue and the network hop, and it sees only this door's share of the
  traffic (the page says how many doors there are).
* `SampleRing`: the last HISTORY samples (dashboard.build_sample), one every SAMPLE_S.
* `DashboardFeed`: gathers the builders' inputs from the front door's table and queues and the
  autoscaler's records, and answers the dashboard's paths:

      GET /hbm/dashboard            the page (public: it holds no data)
      GET /hbm/dashboard/app.js     its script, plain SVG charts drawn by its own small code
      GET /hbm/dashboard/app.css
      GET /hbm/dashboard/data       the snapshot as JSON: needs the admin token (access/paths.py)
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from importlib import resources
from typing import Any, Callable

from hbmserve.autoscale.signals import p95
from hbmserve.core.config import ClusterSpec
from hbmserve.core.records import DecisionRecord
from hbmserve.core.door_records import AdapterTraffic
from hbmserve.core.rollout_records import RolloutRecord
from hbmserve.deployments.ingress.dashboard import (HISTORY, ClientLatency, DashboardSample, DashboardSnapshot,
                                                 ModelInputs, ModelKvIndex, ReplicaView, build_sample, build_snapshot)
from hbmserve.deployments.kv.door_kv import kv_routing
from hbmserve.deployments.wire.chunk_push import ObservedPush
from hbmserve.deployments.wire.http import openai_error, request_lengths
from hbmserve.deployments.wire.names import engine_pools, pool_prices
from hbmserve.capacity.perf.scenario import replica_usd_per_hour

LATENCY_WINDOW_S = 30.0  # p95 over the replies finished in the last 30 s
RATE_WINDOW_S = 10.0  # tokens/s over a shorter window: the chart should follow a burst
# A TPOT figure needs a few tokens after the first relayed chunk.
MIN_TPOT_TOKENS = 3
_SSE_EVENT = b"data: "
_SSE_DONE = b"data: [DONE]"

PAGE_PATH = "/hbm/dashboard"
DATA_PATH = "/hbm/dashboard/data"
_ASSETS = {PAGE_PATH: ("index.html", b"text/html; charset=utf-8"),
           PAGE_PATH + "/app.js": ("app.js", b"text/javascript; charset=utf-8"),
           PAGE_PATH + "/app.css": ("app.css", b"text/css; charset=utf-8")}
ASSET_PATHS = frozenset(_ASSETS)


class ReplyWindow:
    """One model's relayed replies over the last LATENCY_WINDOW_S (mutable; times from `clock`)."""

    def __init__(self) -> None:
        self.ttft_s: deque[tuple[float, float]] = deque()  # (finished at, seconds)
        self.tpot_s: deque[tuple[float, float]] = deque()
        self.tokens: deque[tuple[float, int]] = deque()  # (finished at, output tokens)

    def record(self, at: float, ttft_s: float | None, tpot_s: float | None, output_tokens: int) -> None:
        if ttft_s is not None:
            self.ttft_s.append((at, ttft_s))
        if tpot_s is not None:
            self.tpot_s.append((at, tpot_s))
        self.tokens.append((at, output_tokens))

    def figures(self, now: float) -> ClientLatency:
        for samples, window in ((self.ttft_s, LATENCY_WINDOW_S), (self.tpot_s, LATENCY_WINDOW_S),
                                (self.tokens, RATE_WINDOW_S)):
            while samples and samples[0][0] < now - window:
                samples.popleft()
        return ClientLatency(ttft_p95_s=p95(tuple(s for _, s in self.ttft_s)),
                             tpot_p95_s=p95(tuple(s for _, s in self.tpot_s)),
                             tokens_per_s=sum(n for _, n in self.tokens) / RATE_WINDOW_S)


class ReplyWatch:
    """An ASGI `send` that times a generation reply on its way to the client.

    TTFT and TPOT only for streamed replies (text/event-stream): a whole JSON reply's first byte
    is its last. Relayed chunks may carry several SSE events (the relay forwards what the socket
    had), so tokens are counted as events, and TPOT is the time from the first relayed chunk to
    the last over the events that came after the first chunk. Output tokens: the reply's `usage`
    when it has one, else one per event (replica_middleware.request_lengths). A reply the
    client abandoned never finishes and is not recorded."""

    def __init__(self, send, window: ReplyWindow, arrived_at: float, request_bytes: int,
                 clock: Callable[[], float] = time.monotonic):
        self.send, self.window, self.arrived_at, self.request_bytes = send, window, arrived_at, request_bytes
        self.clock = clock
        inner = getattr(send, "push", None)  # a relayed stream's middle, written past `send`: timed too
        self.push = None if inner is None else ObservedPush(inner, lambda body: self._body(body, True))
        self.status, self.streamed = 0, False
        self.events = self.first_events = 0
        self.first_at: float | None = None
        self.last_at = 0.0
        self.last_body = b""

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            headers = dict(message.get("headers", ()))
            self.streamed = headers.get(b"content-type", b"").startswith(b"text/event-stream")
        elif message["type"] == "http.response.body":
            self._body(message.get("body", b""), message.get("more_body", False))
        await self.send(message)

    def _body(self, body: bytes, more: bool) -> None:
        tokens = body.count(_SSE_EVENT) - body.count(_SSE_DONE) if self.streamed else int(bool(body))
        if tokens > 0:
            self.last_at = self.clock()
            self.last_body = body
            if self.first_at is None:
                self.first_at, self.first_events = self.last_at, tokens
            self.events += tokens
        if not more:
            self._finish()

    def _finish(self) -> None:
        if self.status != 200 or self.first_at is None:
            return
        ttft = tpot = None
        if self.streamed:
            ttft = self.first_at - self.arrived_at
            after_first = self.events - self.first_events
            if after_first >= MIN_TPOT_TOKENS:
                tpot = (self.last_at - self.first_at) / after_first
        output = request_lengths(_last_event(self.last_body) if self.streamed else self.last_body,
                                 self.request_bytes, self.events)[1]
        self.window.record(self.clock(), ttft, tpot, output)


def _last_event(body: bytes) -> bytes:
    """The last SSE event of a chunk other than the end marker: where a usage report would be."""
    events = [e for e in body.split(_SSE_EVENT) if e.strip() and e.strip() != b"[DONE]"]
    return _SSE_EVENT + events[-1] if events else body


class SampleRing:
    """The last `capacity` dashboard samples, oldest first."""

    def __init__(self, capacity: int = HISTORY) -> None:
        self._samples: deque[DashboardSample] = deque(maxlen=capacity)

    def push(self, sample: DashboardSample) -> None:
        self._samples.append(sample)

    def samples(self) -> tuple[DashboardSample, ...]:
        return tuple(self._samples)


def _page_file(name: str) -> bytes:
    return resources.files("hbmserve.deployments.ingress").joinpath("dashboard_page", name).read_bytes()


class DashboardFeed:
    """One front door's dashboard: its reply windows, its ring, and the page's paths."""

    def __init__(self, spec: ClusterSpec, table, admission: dict, door_of: Callable[[], tuple[str, int, bool]]):
        """`table`: the door's ReplicaTable; `admission`: model -> ModelAdmission; `door_of`: () ->
        (this door's node id, live doors, auth enforced)."""
        self.spec, self.table, self.admission, self.door_of = spec, table, admission, door_of
        self.windows = {m.name: ReplyWindow() for m in spec.models}
        self.ring = SampleRing()
        self.prices = pool_prices(spec.models, replica_usd_per_hour)
        self.topology = _topology(spec)
        self.decisions: dict[str, DecisionRecord | None] = {}
        self.logs: dict[str, tuple[DecisionRecord, ...]] = {}
        self.rollouts: tuple[RolloutRecord, ...] = ()
        self.pages = {path: (_page_file(name), kind) for path, (name, kind) in _ASSETS.items()}
        # () -> each LoRA adapter's figures; the door app sets it (its AdapterMeter).
        self.adapters_of: Callable[[], tuple[AdapterTraffic, ...]] = tuple

    def watch(self, model: str, send, arrived_at: float, request_bytes: int):
        return ReplyWatch(send, self.windows[model], arrived_at, request_bytes)

    async def refresh(self) -> None:
        """Read the autoscaler's records (blocking KV reads, off the loop), then take a sample."""
        from hbmserve.deployments.wire.records_store import latest_decision, recent_decisions, rollouts

        def read():
            scaled = [(row, model, deployment) for row, model, _, _, deployment in self._rows()
                      if row.autoscaling is not None]
            return ({row.name: latest_decision(model, deployment) for row, model, deployment in scaled},
                    {row.name: recent_decisions(model, deployment) for row, model, deployment in scaled},
                    tuple(rollouts()))

        self.decisions, self.logs, self.rollouts = await asyncio.to_thread(read)
        self.ring.push(build_sample(time.time(), self.inputs()))

    def _rows(self):
        """(the row as a model, the model's name, its pool_key, its pool or None, its engine
        deployment): a row per model, or per pool of a disaggregated model ("m (prefill)")."""
        for m in self.spec.models:
            for key, (deployment, pool) in engine_pools(m).items():
                role = key.partition("#")[2] or None
                row = pool if role is None else pool.model_copy(update={"name": f"{m.name} ({role})"})
                yield row, m.name, key, role, deployment

    def inputs(self) -> tuple[ModelInputs, ...]:
        now = time.monotonic()
        out = []
        for row, model, key, role, _ in self._rows():
            views = tuple(ReplicaView(replica=r.endpoint.replica, node_id=r.endpoint.node_id, reachable=r.reachable,
                                      waiting=r.waiting, running=r.running, kv_usage=r.kv_usage,
                                      placement=r.endpoint.placement, prompt_tokens=r.prompt_tokens,
                                      prefix_hit_tokens=r.prefix_hit_tokens)
                          for r in self.table.replicas.get(model, {}).values() if r.endpoint.role == role)
            # The client's replies (and the requests held for them) are the decode pool's.
            replies = role in (None, "decode")
            out.append(ModelInputs(
                model=row.name, ttft_slo_s=row.slo.ttft_p95_ms / 1000, tpot_slo_s=row.slo.tpot_p95_ms / 1000,
                usd_per_replica_hour=self.prices.get(key),
                fixed_replicas=row.replicas if row.autoscaling is None else None,
                decision=self.decisions.get(row.name), replicas=views,
                held=self.admission[model].queued if replies else 0,
                latency=(self.windows[model] if replies else ReplyWindow()).figures(now)))
        return tuple(out)

    def snapshot(self) -> DashboardSnapshot:
        door, doors, auth = self.door_of()
        kv = () if self.table.kv is None else tuple(
            ModelKvIndex(model=name, index=kv_routing(k)) for name, k in self.table.kv.reports().items())
        return build_snapshot(time.time(), door, doors, auth, self.ring.samples(), self.inputs(), self.logs,
                              self.topology, self.rollouts, kv, self.adapters_of())

    def messages(self, method: str, path: str) -> tuple[dict, dict]:
        """The reply to a dashboard path (the front door has already checked its credential)."""
        if method not in ("GET", "HEAD"):
            return openai_error(405, f"{path} takes GET", "invalid_request_error", "method_not_allowed")
        if path == DATA_PATH:
            body = self.snapshot().to_json().encode()
            kind = b"application/json"
        elif path in self.pages:
            body, kind = self.pages[path]
        else:
            return openai_error(404, f"no such path: {path}", "invalid_request_error", "not_found")
        start = {"type": "http.response.start", "status": 200,
                 "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode()),
                             (b"cache-control", b"no-store")]}
        return start, {"type": "http.response.body", "body": b"" if method == "HEAD" else body}


def _topology(spec: ClusterSpec):
    """The cluster's topology file, when the config names one and this node can read it; the map
    then lists replicas by Ray node only."""
    if spec.topology is None:
        return None
    import logging

    from hbmserve.placement.cluster_file import TopologyFileError, load_cluster_file

    try:
        return load_cluster_file(spec.topology)
    except (TopologyFileError, OSError) as err:
        logging.getLogger("hbmserve.frontdoor").warning("dashboard: no placement map: %s", err)
        return None

