"""The front door's adapter to ingress admission (routing/queue.py) for one model: it builds the
`ModelCapacity` snapshot from the replica table and the config, keeps the wait queue, and parks
each queued request on a future that `pump()` resolves when `next_to_run` releases it.

Counting is in sequences (the request's `n`) and KV tokens, never in connections: a request
enters admission only once its whole body has arrived (front_door_app.read_body).

Several front doors (one per node) admit for the same replicas. Each takes an equal share of a
model's running and queue capacity (`ReplicaTable.doors`, from the doors' announcements) and
counts only what it admitted itself, so together they never admit more than the model can hold,
whatever their views' lag; the replicas' own reports lag by a poll, which a burst outruns (an
earlier version admitted against them and 3 doors took 79 of 96 burst requests for 32 slots).
The price is an idle share when clients favour one node; the load balancer in front spreads
them. Each replica's own cap (replica_middleware) remains the last guard.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque

from hbmserve.core.config import ModelSpec
from hbmserve.deployments.ingress.front_door_access import Credential, Refusal
from hbmserve.deployments.ingress.request_body import Generation
from hbmserve.deployments.ingress.replica_table import ReplicaTable
from hbmserve.routing.replica_cap import Reject
from hbmserve.routing.queue import Ask, ModelCapacity, Enqueue, Waiting, admit, expired, next_to_run

# Queue room per active replica beyond its running batch, in batches: the replica safety cap
# (serve_app.QUEUE_SLOTS_PER_SEQ = 4 batches in all) less the running one.
QUEUE_BATCHES = 3
# After the policy promotes a hot standby (its upscale delay), the front doors route to it at
# their next discovery (0.5 s).
DISCOVERY_S = 0.5
# Output tokens admission assumes when a chat request names no max_tokens (OpenAI's default is
# "until the context ends", which would make every request look as big as the whole context to
# the KV bound and the router). The tenant is charged to the context's end all the same, and
# settled with the engine's usage (front_door_app.py).
DEFAULT_MAX_TOKENS = 256
_PACE_WINDOW_S = 30.0
_MIN_PACE_SAMPLES = 3
# The median hold is recomputed at most this often, over at most _PACE_SAMPLES recent requests:
# sorting a 30-s window on every request cost the door ~0.5 ms a request at 70 req/s.
_PACE_REFRESH_S = 0.5
_PACE_SAMPLES = 2048


def ask_for(credential: Credential, model: ModelSpec, gen: Generation, now: float) -> Ask:
    """The admission ask of a request the engine will run as `gen` (deployments/ingress/request_body.py)."""
    limit = model.engine_settings.max_model_len
    tenant = credential.tenant
    max_tokens = DEFAULT_MAX_TOKENS if gen.max_tokens is None else gen.max_tokens
    # An embedding batch larger than a batch is run a batch at a time: it holds at most one.
    return Ask(tenant=tenant.name if tenant else "-", priority=tenant.priority if tenant else 0,
               sequences=min(gen.sequences, model.engine_settings.max_num_seqs),
               prompt_tokens=min(limit, gen.prompt_tokens),
               max_tokens=min(limit, max_tokens), arrived_at=now)


class ModelAdmission:
    def __init__(self, model: ModelSpec, table: ReplicaTable, clock=time.monotonic):
        self.model = model
        self.table = table
        self.clock = clock
        self.waiting: list[Ask] = []
        self._parked: dict[int, asyncio.Future] = {}  # id(ask) -> future of the queued ask
        self._admitted_at: dict[int, float] = {}  # id(ask) -> when it got its slot
        self.in_flight_sequences = 0
        self.in_flight_tokens = 0
        self._durations: deque[tuple[float, float]] = deque(maxlen=_PACE_SAMPLES)  # (finished at, seconds admitted)
        self._held_s: float | None = None  # the median of _durations, as of _held_at
        self._held_at = -math.inf
        self.accepted = 0
        self.rejected = 0
        self._refused_at: deque[float] = deque()  # capacity refusals: demand the policy must see

    # -- the snapshot ----------------------------------------------------------------------
    def _pace(self, now: float, active_sequences: int) -> float | None:
        """Sequences the model completes per second when full: its batch over the median time a
        request holds a slot (Little's law). Counting completions instead would measure the
        offered load, which under light traffic is far below what the model can do."""
        if now - self._held_at >= _PACE_REFRESH_S:
            while self._durations and self._durations[0][0] < now - _PACE_WINDOW_S:
                self._durations.popleft()
            n = len(self._durations)
            self._held_s = sorted(d for _, d in self._durations)[n // 2] if n >= _MIN_PACE_SAMPLES else None
            self._held_at = now
        if self._held_s is None or active_sequences == 0:
            return None
        return active_sequences / max(self._held_s, 1e-3)

    def capacity(self, now: float) -> ModelCapacity:
        m, s = self.model, self.model.engine_settings
        routable = self.table.routable(m.name)
        spare = self.table.starting_or_standby(m.name)
        doors = max(1, self.table.doors)
        promotion_s = (m.autoscaling.upscale_delay_s if m.autoscaling is not None else 0.0) + DISCOVERY_S

        def share(total: int) -> int:
            return -(-total // doors)  # ceil: a lone request is never refused for rounding

        if routable == 0 and m.autoscaling is not None:
            # Scale from zero (or every replica lost): hold up to one replica's worth of queue
            # while the autoscaler, which counts what is held here, starts one. No early SLO
            # refusal: a refused request would leave nothing held, and nothing would start.
            # What waits past scale_from_zero_wait_s is answered 503 (pump).
            return ModelCapacity(
                active_sequences=0, in_flight_sequences=self.in_flight_sequences,
                in_flight_tokens=self.in_flight_tokens, max_tokens_in_flight=0,
                queue_sequences=share(s.max_num_seqs * (QUEUE_BATCHES + 1)),
                help_arriving_s=promotion_s if spare else m.autoscaling.startup_s.warm,
                help_sequences=share(s.max_num_seqs), completion_sequences_per_s=self._pace(now, share(s.max_num_seqs)))
        # At least one replica's batch: an ask as big as a replica can run must fit an idle door.
        active = max(share(routable * s.max_num_seqs), s.max_num_seqs)
        return ModelCapacity(
            active_sequences=active, in_flight_sequences=self.in_flight_sequences,
            in_flight_tokens=self.in_flight_tokens, max_tokens_in_flight=active * s.max_model_len,
            queue_sequences=share(routable * s.max_num_seqs * QUEUE_BATCHES),
            ttft_slo_s=m.slo.ttft_p95_ms / 1000,
            help_arriving_s=promotion_s if spare else None, help_sequences=share(spare * s.max_num_seqs),
            max_hold_s=promotion_s, completion_sequences_per_s=self._pace(now, active))

    # -- requests ----------------------------------------------------------------------------
    async def enter(self, ask: Ask) -> Ask | Refusal:
        """Admit `ask` (returned as the ticket to `leave` with), possibly after a wait, or refuse."""
        now = self.clock()
        capacity = self.capacity(now)
        if capacity.active_sequences and (ask.sequences > capacity.active_sequences
                                          or ask.tokens > capacity.max_tokens_in_flight):
            # Bigger than the model can ever run at once: queueing would only time out.
            self.rejected += 1
            return Refusal(400, f"{self.model.name}: the request needs {ask.sequences} sequences and up to "
                           f"{ask.tokens} tokens; at most {capacity.active_sequences} and "
                           f"{capacity.max_tokens_in_flight} fit at once", "invalid_request_error",
                           "request_too_large")
        decision = admit(ask, capacity, Waiting(tuple(self.waiting)), now)
        if isinstance(decision, Reject):
            self.rejected += 1
            self._refused_at.append(now)
            return Refusal(429, f"{self.model.name}: {decision.reason}", "rate_limit_error", decision.code,
                           decision.retry_after_s)
        self.accepted += 1
        if not isinstance(decision, Enqueue):
            self._charge(ask, now)
            return ask
        future = asyncio.get_running_loop().create_future()
        self.waiting.append(ask)
        self._parked[id(ask)] = future
        try:
            return await future
        except asyncio.CancelledError:  # the client went away
            if future.done() and not future.cancelled() and future.result() is ask:
                self.leave(ask)  # released to it just now: give the slot back
            raise
        finally:
            self._unqueue(ask)  # a no-op unless the client went away while queued
            self._parked.pop(id(ask), None)

    def leave(self, ask: Ask) -> None:
        now = self.clock()
        self.in_flight_sequences -= ask.sequences
        self.in_flight_tokens -= ask.tokens
        self._durations.append((now, now - self._admitted_at.pop(id(ask), now)))
        self.pump()

    def _charge(self, ask: Ask, now: float) -> None:
        self.in_flight_sequences += ask.sequences
        self.in_flight_tokens += ask.tokens
        self._admitted_at[id(ask)] = now

    def pump(self) -> None:
        """Release what fits now; answer what waited too long (503 + Retry-After). Called after
        every `leave` and on every replica poll (capacity may have arrived)."""
        if not self.waiting:
            return
        now = self.clock()
        capacity = self.capacity(now)
        for ask in next_to_run(Waiting(tuple(self.waiting)), capacity).asks:
            self._unqueue(ask)
            self._charge(ask, now)
            self._resolve(ask, ask)
        max_wait = (self.model.autoscaling.scale_from_zero_wait_s if self.model.autoscaling is not None
                    else self.model.slo.ttft_p95_ms / 1000 * 10)
        for gone in expired(Waiting(tuple(self.waiting)), capacity, now, max_wait):
            self._refused_at.append(now)
            self._unqueue(gone.ask)
            self._resolve(gone.ask, Refusal(503, f"{self.model.name}: {gone.reason}", "service_unavailable",
                                            gone.code, gone.retry_after_s))

    def _unqueue(self, ask: Ask) -> None:
        # By identity: two asks of one tenant may be equal field by field.
        self.waiting = [a for a in self.waiting if a is not ask]

    def _resolve(self, ask: Ask, result: Ask | Refusal) -> None:
        future = self._parked.get(id(ask))
        if future is not None and not future.done():
            future.set_result(result)

    @property
    def queued(self) -> int:
        return len(self.waiting)

    def refused_rps(self) -> float:
        """Requests/s refused for capacity over the last window: arrivals that no replica counts,
        so the front door reports them to the autoscaler (the request too large to ever run,
        a tenant over its limits, or a bad key is not demand for more replicas)."""
        now = self.clock()
        while self._refused_at and self._refused_at[0] < now - _PACE_WINDOW_S:
            self._refused_at.popleft()
        return len(self._refused_at) / _PACE_WINDOW_S
