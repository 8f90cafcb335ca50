"""The front door's picture of every model's replicas: where they listen, which are active,
and how loaded each is, kept fresh by polling; and the `ReplicaLoad`s `routing.choose` ranks.

Three sources, each refreshed by the front door's loops (front_door.py):
* endpoints the replicas announce (records_store.live_endpoints, ~1 s);
* the autoscaling policy's decision: which replicas are active (records_store.latest_decision);
  a model with a fixed replica count has every replica active;
* each replica's own load report (`GET /hbm/load`, every POLL_S), the same counters the
  autoscaler reads. Between polls the front door adds the requests it sent since, so a burst
  that arrives between two polls does not all land on the replica that looked idlest.
A replica that fails a poll or a connection is out of rotation until a poll succeeds again:
a dead replica or a removed node is routed around at once. The streams it is serving are cut
when it has failed every poll for `lost_after_s` (unless it announced that it drains), or when
it leaves the endpoint list: a node
that vanishes without closing its sockets would otherwise hold them until a timeout, and a cut
stream goes on from another replica (migration.py).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from hbmserve.core.kv_events import ReplicaKv
from hbmserve.core.records import AdapterHolding, DecisionRecord, LoadReport, RecordError, ReplicaEndpoint
from hbmserve.core.routing import ReplicaLoad
from hbmserve.core.scaling import ReplicaState
from hbmserve.routing.prefix import RecentPrefixes
from hbmserve.deployments.kv.door_kv import DoorKv
from hbmserve.deployments.wire.http import INTERNAL_TOKEN_HEADER, LOAD_PATH
from hbmserve.deployments.wire.names import pool_key
from hbmserve.deployments.wire.upstream import UpstreamPool

log = logging.getLogger("hbmserve.frontdoor")

POLL_S = 0.1
POLL_TIMEOUT_S = 1.0
LOST_AFTER_S = 5.0  # failing polls this long: the replica is gone, its streams are cut
# Prefix block hashes remembered per replica: the router's picture of its prefix cache (what it
# sent there lately). 64-character blocks: 20k of them is ~1.3 MB of prompt text.
PREFIX_MEMORY = 20_000


@dataclass
class KnownReplica:
    """One replica as this front door sees it (mutable: the loops update it in place)."""

    endpoint: ReplicaEndpoint
    active: bool = False
    reachable: bool = False  # the last poll succeeded
    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    prompt_tokens: int = 0  # since its start, looked up in its prefix cache
    prefix_hit_tokens: int = 0  # of those, found there
    sent_since_poll: int = 0
    prefixes: RecentPrefixes = field(default_factory=lambda: RecentPrefixes(PREFIX_MEMORY))
    unreachable_since: float | None = None  # loop time of the first poll failed in a row
    streams: set = field(default_factory=set)  # the replies being relayed from it now
    adapters: AdapterHolding = AdapterHolding()  # its LoRA adapters, as its last report said

    def cut_streams(self) -> None:
        """Close every reply being relayed from this replica: each relay sees a broken stream."""
        for resp in list(self.streams):
            resp.close()
        self.streams.clear()

    def remember(self, hashes: tuple[int, ...]) -> None:
        self.prefixes.remember(hashes)

    def load(self, kv: ReplicaKv | None = None) -> ReplicaLoad:
        """`kv`: what the replica's engine reports holding (its KV index view), for a request
        hashed as the engine hashes; None: what this door sent it (approximate)."""
        state = ReplicaState.ACTIVE if self.active and self.reachable else ReplicaState.STANDBY
        cached, host = (self.prefixes.keys(), frozenset()) if kv is None else (kv.hbm, kv.host)
        return ReplicaLoad(self.endpoint.replica, state, waiting=self.waiting + self.sent_since_poll,
                           running=self.running, kv_usage=self.kv_usage, cached_prefixes=cached, host_prefixes=host,
                           adapters=frozenset(self.adapters.resident), adapter_slots=self.adapters.slots)


class ReplicaTable:
    """Every model's replicas, by model; a disaggregated model's replicas carry their pool's
    role (`loads(model, role=...)`). `autoscaled` and the decisions are keyed by names.pool_key."""

    def __init__(self, models: list[str], autoscaled: set[str], lost_after_s: float = LOST_AFTER_S,
                 kv: DoorKv | None = None):
        self.models = models
        self.kv = kv  # the engines' KV events, followed for the replicas that publish them
        self.lost_after_s = lost_after_s
        self.autoscaled = autoscaled
        self.replicas: dict[str, dict[str, KnownReplica]] = {m: {} for m in models}
        self.doors = 1  # live front doors, this one included: they split each model's admission

    # -- refresh -------------------------------------------------------------------------
    def update(self, endpoints: list[ReplicaEndpoint], decisions: dict[str, DecisionRecord | None]) -> None:
        """New endpoint list and decisions (by model); keeps what it knew of known replicas."""
        seen: dict[str, dict[str, ReplicaEndpoint]] = {m: {} for m in self.models}
        for ep in endpoints:
            if ep.model in seen:
                seen[ep.model][ep.replica] = ep
        for model, eps in seen.items():
            table = self.replicas[model]
            for gone in set(table) - set(eps):
                table.pop(gone).cut_streams()
            for rid, ep in eps.items():
                key = pool_key(model, ep.role)  # a disaggregated model's pools scale apart
                decision = decisions.get(key)
                r = table.get(rid)
                if r is None or r.endpoint.url != ep.url:
                    if r is not None:
                        r.cut_streams()
                    r = table[rid] = KnownReplica(ep)
                r.endpoint = ep
                r.active = not ep.draining and (key not in self.autoscaled or decision is None
                                                or rid in decision.active_replicas)
            if self.kv is not None:
                self.kv.sync(model, eps.values())

    async def poll(self, client: UpstreamPool, token: str) -> None:
        """Every known replica's load report, concurrently, over the relay's own HTTP client."""
        everyone = [r for table in self.replicas.values() for r in table.values()]
        await asyncio.gather(*(self._poll_one(client, r, token) for r in everyone))

    async def _poll_one(self, client: UpstreamPool, r: KnownReplica, token: str) -> None:
        try:
            status, body = await client.get(r.endpoint.url + LOAD_PATH, {INTERNAL_TOKEN_HEADER.decode(): token},
                                            POLL_TIMEOUT_S)
            report = LoadReport.from_json(body) if status == 200 else None
        except (OSError, TimeoutError, RecordError):
            report = None
        if report is None:
            if r.reachable:
                log.warning("replica %s of %s at %s stopped answering: out of rotation", r.endpoint.replica,
                            r.endpoint.model, r.endpoint.url)
            r.reachable = False
            now = asyncio.get_running_loop().time()
            r.unreachable_since = now if r.unreachable_since is None else r.unreachable_since
            # A draining replica stops answering polls while its streams go on: they are cut
            # only if its announcement lapses (it died mid-drain).
            if r.streams and not r.endpoint.draining and now - r.unreachable_since >= self.lost_after_s:
                log.warning("replica %s of %s silent for %.0f s: cutting its %d streams", r.endpoint.replica,
                            r.endpoint.model, now - r.unreachable_since, len(r.streams))
                r.cut_streams()
            return
        r.reachable, r.unreachable_since = True, None
        r.waiting, r.running, r.kv_usage = report.waiting, report.running, report.kv_usage
        r.prompt_tokens, r.prefix_hit_tokens = report.prompt_tokens, report.prefix_hit_tokens
        r.adapters = report.adapters
        r.sent_since_poll = 0

    # -- routing ------------------------------------------------------------------------
    def loads(self, model: str, precise: bool = False, role: str | None = None) -> list[ReplicaLoad]:
        """`precise`: the request carries the engines' own block hashes (DoorKv.hashes), so each
        replica's cache is what its engine reports; a view the index cannot vouch for (a gap,
        lag, no events yet) counts as holding nothing, and load decides. `role`: only that pool's
        replicas of a disaggregated model."""
        table = {rid: r for rid, r in self.replicas.get(model, {}).items() if role is None or r.endpoint.role == role}
        if precise and self.kv is not None:
            return [r.load(self.kv.view(model, rid)) for rid, r in table.items()]
        return [r.load() for r in table.values()]

    def get(self, model: str, replica: str) -> KnownReplica | None:
        return self.replicas.get(model, {}).get(replica)

    def _serving(self, model: str):
        """The replicas a model's streams run on: all, or a disaggregated model's decode pool."""
        return (r for r in self.replicas.get(model, {}).values() if r.endpoint.role in (None, "decode"))

    def routable(self, model: str, role: str | None = None) -> int:
        """Replicas taking traffic: those streams run on, or one pool's (`role`)."""
        replicas = self._serving(model) if role is None else (
            r for r in self.replicas.get(model, {}).values() if r.endpoint.role == role)
        return sum(1 for r in replicas if r.active and r.reachable)

    def starting_or_standby(self, model: str) -> int:
        """Replicas that exist but take no traffic yet: help that may arrive soon."""
        return sum(1 for r in self._serving(model) if not (r.active and r.reachable))

    def mark_unreachable(self, model: str, replica: str) -> None:
        r = self.get(model, replica)
        if r is not None:
            r.reachable = False

