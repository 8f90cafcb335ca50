"""Ingress admission for one model: admit now, hold in a bounded queue, or refuse at once. Pure.

The per-node ingress calls this for every model it fronts; each replica keeps its own safety
cap (replica_cap.py). The ingress counts work, not connections: a request's `n` sequences and the
KV tokens it may hold, against the bounds of the model's active replicas.

The rules, and why:
* Admit at once only when the ask fits the in-flight bounds and no ask of its priority or
  higher is waiting: a newcomer never overtakes the queue.
* Otherwise queue it if the queue, counted in sequences, has room. Nothing accepted is ever
  dropped to make room: a full queue refuses the newcomer, whatever its priority, with 429 and
  a Retry-After sized to drain the excess at the observed pace.
* Refuse at once (`slo_unreachable`) when the predicted TTFT already misses the SLO: waiting
  would spend the client's time and the queue's room on a request that is late anyway. The
  prediction is optimistic (completions go on at the observed pace, nothing overtakes, the
  token bound is left out), so a refusal means "sure to miss", not "might miss". Without an
  SLO, or without a pace to predict from, nothing is refused early.
* Hold when help is coming: when extra capacity (a standby being promoted, a replica starting)
  arrives within the SLO, or within `max_hold_s` without one, the queue may grow by what that
  capacity will run. Measured before this existed: 1 active replica + 1 hot standby took a burst
  of 60 requests, refused 44 at once, and promoted the standby after the burst was over.

Release (`next_to_run`) is strict priority, FIFO within a priority, and stops at the first ask
that does not fit: no backfilling past a blocked head, even by a lower priority. Backfilling
would let small asks take every slot that frees, so the room a big head needs would never
gather (it starves), and a lower priority would run while a higher one waits. vLLM's scheduler
treats its own waiting queue the same way. The cost is room left idle until enough in-flight
work finishes for the head; expiry bounds the wait.

What the ingress answers:
* `Reject` -> 429, type "rate_limit_error", code `Reject.code`, header Retry-After.
* `Expired` -> 503, type "service_unavailable", code "queue_timeout", header Retry-After. The
  request was accepted, so a time-out is the server failing to serve it, not the client sending
  too much; it is answered, never dropped silently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hbmserve.routing.replica_cap import Admit, Reject

QUEUE_FULL = "queue_full"
SLO_UNREACHABLE = "slo_unreachable"
QUEUE_TIMEOUT = "queue_timeout"
# A Retry-After of more than an hour tells the client nothing more; it also keeps the header
# finite when the observed pace is close to zero.
MAX_RETRY_AFTER_S = 3600


@dataclass(frozen=True)
class Ask:
    """One generation request at the ingress; `arrived_at` is on the caller's clock, as `now`."""

    tenant: str
    priority: int  # higher is more important
    sequences: int  # the request's n: each is one running sequence in the engine
    prompt_tokens: int
    max_tokens: int
    arrived_at: float

    def __post_init__(self) -> None:
        if self.sequences < 1:
            raise ValueError(f"sequences (the request's n) must be at least 1, got {self.sequences}")
        if self.prompt_tokens < 0 or self.max_tokens < 0:
            raise ValueError(f"token counts must not be negative: prompt_tokens={self.prompt_tokens}, "
                             f"max_tokens={self.max_tokens}")

    @property
    def tokens(self) -> int:
        """KV tokens it may hold at its longest: the prompt once (its sequences share the
        prompt's prefix blocks) and max_tokens for each sequence."""
        return self.prompt_tokens + self.sequences * self.max_tokens


@dataclass(frozen=True)
class ModelCapacity:
    """What one model can take now, as the ingress sees it."""

    active_sequences: int  # sum of max_num_seqs over the ACTIVE replicas
    in_flight_sequences: int
    in_flight_tokens: int
    max_tokens_in_flight: int
    queue_sequences: int  # the wait queue's bound, in sequences
    prefill_tokens_per_s: float | None = None  # whole model, observed or predicted
    ttft_slo_s: float | None = None
    help_arriving_s: float | None = None  # until extra capacity is expected; None: none coming
    help_sequences: int = 0  # what that capacity will run at once (its max_num_seqs)
    # Without an SLO: the longest wait for help that is worth holding a burst for.
    max_hold_s: float | None = None
    completion_sequences_per_s: float | None = None  # observed; None before any finished
    default_retry_after_s: float = 1.0  # when no pace is known

    @property
    def free_sequences(self) -> int:
        return self.active_sequences - self.in_flight_sequences

    @property
    def free_tokens(self) -> int:
        return self.max_tokens_in_flight - self.in_flight_tokens

    @property
    def help_in_time(self) -> bool:
        """Whether the arriving capacity comes soon enough to hold requests for it."""
        horizon = self.ttft_slo_s if self.ttft_slo_s is not None else self.max_hold_s
        return (self.help_arriving_s is not None and self.help_sequences > 0 and horizon is not None
                and self.help_arriving_s <= horizon)

    @property
    def burst_queue_sequences(self) -> int:
        """The queue's bound while help is in time: what the arriving capacity will run comes
        on top, so once it is up the queue is back within its normal bound."""
        return self.queue_sequences + max(0, self.help_sequences)

    @property
    def queue_bound(self) -> int:
        return self.burst_queue_sequences if self.help_in_time else self.queue_sequences


@dataclass(frozen=True)
class Waiting:
    """The model's wait queue, in arrival order (the ingress appends)."""

    asks: tuple[Ask, ...] = ()

    @property
    def sequences(self) -> int:
        return sum(a.sequences for a in self.asks)

    def release_order(self) -> tuple[Ask, ...]:
        """Highest priority first, arrival order within a priority (the sort is stable)."""
        return tuple(sorted(self.asks, key=lambda a: -a.priority))

    def ahead_of(self, ask: Ask) -> tuple[Ask, ...]:
        """Who runs before a newcomer: every waiting ask of its priority or higher."""
        return tuple(a for a in self.asks if a.priority >= ask.priority)


@dataclass(frozen=True)
class Enqueue:
    reason: str
    position: int  # place in release order once queued: 1 runs next


@dataclass(frozen=True)
class Release:
    asks: tuple[Ask, ...]  # to start now, in this order
    reason: str


@dataclass(frozen=True)
class Expired:
    ask: Ask
    reason: str
    retry_after_s: int
    code: str = QUEUE_TIMEOUT


def admit(ask: Ask, capacity: ModelCapacity, waiting: Waiting, now: float) -> Admit | Enqueue | Reject:
    """Admit `ask` now, queue it, or refuse it at once; never touches what was accepted before."""
    ahead = waiting.ahead_of(ask)
    if not ahead and _fits(ask, capacity.free_sequences, capacity.free_tokens):
        return Admit(f"{capacity.in_flight_sequences + ask.sequences}/{capacity.active_sequences} sequences, "
                     f"{capacity.in_flight_tokens + ask.tokens}/{capacity.max_tokens_in_flight} tokens in flight")
    why_wait = (f"{len(ahead)} request(s) of priority >= {ask.priority} waiting ahead" if ahead else
                f"no room: {capacity.in_flight_sequences}/{capacity.active_sequences} sequences, "
                f"{capacity.in_flight_tokens}/{capacity.max_tokens_in_flight} tokens in flight")
    predicted = predict_ttft(ask, capacity, waiting, now)
    slo = capacity.ttft_slo_s
    if slo is not None and predicted is not None and predicted > slo:
        return Reject(f"predicted time to first token {predicted:.2f}s exceeds the SLO of {slo:g}s "
                      f"({why_wait})", _whole_s(predicted - slo), SLO_UNREACHABLE)
    bound = capacity.queue_bound
    after = waiting.sequences + ask.sequences
    if after <= bound:
        held = (f"; held for capacity arriving in {capacity.help_arriving_s:.2f}s"
                if after > capacity.queue_sequences else "")
        eta = f"; predicted TTFT {predicted:.2f}s" if predicted is not None else ""
        return Enqueue(f"queued: {why_wait}; {after}/{bound} sequences waiting{held}{eta}", len(ahead) + 1)
    behind = sum(1 for a in waiting.asks if a.priority < ask.priority)
    no_evict = (f"; {behind} lower-priority request(s) were accepted first and are not dropped"
                if behind else "")
    return Reject(f"queue full: {waiting.sequences}/{bound} sequences waiting and this request needs "
                  f"{ask.sequences} ({why_wait}){no_evict}",
                  _whole_s(_drain_s(after - bound, capacity)), QUEUE_FULL)


def predict_ttft(ask: Ask, capacity: ModelCapacity, waiting: Waiting, now: float) -> float | None:
    """Optimistic TTFT of `ask` if queued now, counting the time it has waited already; None when
    nothing predicts it (room is needed and neither completions nor help are known to bring it).

    Its prefill starts once room has freed for it and everything ahead of it (in flight and
    queued at its priority or higher, in sequences) and once the prompts queued ahead are
    prefilled: max(room, prefill ahead) + its own prefill. Without a prefill rate, prefill counts 0.
    """
    ahead = waiting.ahead_of(ask)
    excess = capacity.in_flight_sequences + sum(a.sequences for a in ahead) + ask.sequences \
        - capacity.active_sequences
    room = _room_s(excess, capacity)
    if room is None:
        return None
    rate = capacity.prefill_tokens_per_s
    prefill_ahead = sum(a.prompt_tokens for a in ahead) / rate if rate else 0.0
    own = ask.prompt_tokens / rate if rate else 0.0
    return max(0.0, now - ask.arrived_at) + max(room, prefill_ahead) + own


def next_to_run(waiting: Waiting, capacity: ModelCapacity) -> Release:
    """The asks to start now that room freed: strict release order, stopping at the first that
    does not fit (the module docstring says why there is no backfilling)."""
    free_seq, free_tok = capacity.free_sequences, capacity.free_tokens
    out: list[Ask] = []
    for a in waiting.release_order():
        if not _fits(a, free_seq, free_tok):
            return Release(tuple(out), f"released {len(out)}; next ({a.tenant}, priority {a.priority}) needs "
                                       f"{a.sequences} sequences and {a.tokens} tokens, {max(0, free_seq)} and "
                                       f"{max(0, free_tok)} free")
        out.append(a)
        free_seq, free_tok = free_seq - a.sequences, free_tok - a.tokens
    return Release(tuple(out), f"released {len(out)}; queue empty")


def expired(waiting: Waiting, capacity: ModelCapacity, now: float, max_wait_s: float) -> tuple[Expired, ...]:
    """Asks that have waited `max_wait_s` or longer, to answer 503 with a Retry-After sized to
    drain what is still queued ahead of each, itself included, at the observed pace."""
    out: list[Expired] = []
    ahead = 0
    for a in waiting.release_order():
        waited = now - a.arrived_at
        if waited < max_wait_s:
            ahead += a.sequences
            continue
        out.append(Expired(a, f"waited {waited:.1f}s in the queue (limit {max_wait_s:g}s) for "
                              f"{ahead} sequence(s) ahead to make room",
                           _whole_s(_drain_s(ahead + a.sequences, capacity))))
    return tuple(out)


def _fits(ask: Ask, free_sequences: int, free_tokens: int) -> bool:
    return ask.sequences <= free_sequences and ask.tokens <= free_tokens


def _room_s(excess: int, capacity: ModelCapacity) -> float | None:
    """Seconds until `excess` sequences' worth of room frees: completions at the observed pace,
    plus the arriving capacity at its time if that is sooner. None if neither brings it."""
    if excess <= 0:
        return 0.0
    pace = capacity.completion_sequences_per_s or 0.0
    by_completions = excess / pace if pace > 0 else math.inf
    h = capacity.help_arriving_s
    if h is None or capacity.help_sequences <= 0:
        best = by_completions
    else:
        left = excess - pace * h - capacity.help_sequences  # still to free once help is up
        by_help = h if left <= 0 else (h + left / pace if pace > 0 else math.inf)
        best = min(by_completions, by_help)
    return best if math.isfinite(best) else None


def _drain_s(sequences: int, capacity: ModelCapacity) -> float:
    """Seconds to free `sequences` at the observed pace; else until help comes; else the default."""
    if capacity.completion_sequences_per_s:
        return sequences / capacity.completion_sequences_per_s
    if capacity.help_arriving_s is not None:
        return capacity.help_arriving_s
    return capacity.default_retry_after_s


def _whole_s(seconds: float) -> int:
    """A Retry-After: whole seconds, at least 1, at most MAX_RETRY_AFTER_S."""
    return max(1, math.ceil(min(seconds, MAX_RETRY_AFTER_S)))
