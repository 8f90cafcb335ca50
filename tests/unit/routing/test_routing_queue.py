"""Ingress admission per model (routing/queue.py): hand-worked cases, then an ingress driven by
Hypothesis that checks the promises: bounds, FIFO, priority, no eviction, honest refusals."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from hbmserve.routing.replica_cap import Admit, Reject
from hbmserve.routing.queue import (QUEUE_FULL, SLO_UNREACHABLE, Ask, ModelCapacity, Enqueue, Waiting,
                                    admit, expired, next_to_run, predict_ttft)


def ask(priority=0, sequences=1, prompt=100, max_tokens=50, at=0.0, tenant="t"):
    return Ask(tenant, priority, sequences, prompt, max_tokens, at)


# One replica of max_num_seqs 16 and a 4000-token budget, a queue of 8 sequences.
CAP = ModelCapacity(active_sequences=16, in_flight_sequences=10, in_flight_tokens=1000,
                    max_tokens_in_flight=4000, queue_sequences=8)


def test_admits_when_sequences_and_tokens_fit():
    # n=4, prompt 100, 50 tokens each: 100 + 4*50 = 300 tokens; 10+4 = 14 <= 16, 1000+300 <= 4000.
    d = admit(ask(sequences=4), CAP, Waiting(), 0.0)
    assert isinstance(d, Admit) and d.reason == "14/16 sequences, 1300/4000 tokens in flight"


def test_tokens_bound_as_well_as_sequences():
    # 3800 + 300 = 4100 > 4000 tokens although 1 + 4 sequences would fit: it waits.
    d = admit(ask(sequences=4), replace(CAP, in_flight_sequences=1, in_flight_tokens=3800), Waiting(), 0.0)
    assert isinstance(d, Enqueue) and d.position == 1 and "3800/4000 tokens" in d.reason


def test_newcomer_never_overtakes_the_queue_but_outranks_lower_priorities():
    same = admit(ask(priority=1), CAP, Waiting((ask(priority=1),)), 0.0)
    assert isinstance(same, Enqueue) and same.position == 2
    assert "1 request(s) of priority >= 1 waiting ahead" in same.reason
    # Only a lower priority waits (it did not fit: a big ask); the newcomer fits and goes first.
    higher = admit(ask(priority=2), CAP, Waiting((ask(priority=1, sequences=9),)), 0.0)
    assert isinstance(higher, Admit)


def test_full_queue_refuses_newcomers_of_any_priority_and_evicts_nobody():
    # Full in flight; 7 of 8 queue sequences taken; n=4 would make 11: 3 over the bound.
    # At 2 sequences/s finishing, 3 drain in 1.5 s -> Retry-After 2.
    full = replace(CAP, in_flight_sequences=16, completion_sequences_per_s=2.0)
    waiting = Waiting((ask(sequences=3), ask(sequences=4)))
    low = admit(ask(sequences=4), full, waiting, 0.0)
    assert isinstance(low, Reject) and low.code == QUEUE_FULL and low.retry_after_s == 2
    assert "7/8 sequences waiting" in low.reason
    high = admit(ask(priority=5, sequences=4), full, waiting, 0.0)
    assert isinstance(high, Reject) and high.code == QUEUE_FULL
    assert "2 lower-priority request(s) were accepted first and are not dropped" in high.reason
    # No pace observed yet: the default Retry-After.
    assert admit(ask(sequences=4), replace(full, completion_sequences_per_s=None), waiting, 0.0).retry_after_s == 1


# A full model (16/16) with two asks of n=4 and 1000-token prompts queued: the SLO cases.
BUSY = replace(CAP, in_flight_sequences=16, queue_sequences=32, completion_sequences_per_s=4.0,
               prefill_tokens_per_s=10_000.0)
QUEUED = Waiting((ask(sequences=4, prompt=1000), ask(sequences=4, prompt=1000)))


def test_predicted_ttft_by_hand():
    # Room: 16 in flight + 8 ahead + 1 own - 16 active = 9 sequences to finish, at 4/s: 2.25 s.
    # Prefill ahead 2000 / 10000 = 0.2 s (overlaps the wait); its own 500 tokens: 0.05 s.
    # TTFT = max(2.25, 0.2) + 0.05 = 2.30 s; arrived 0.5 s before `now`: 2.80 s.
    assert predict_ttft(ask(prompt=500), BUSY, QUEUED, 0.0) == pytest.approx(2.30)
    assert predict_ttft(ask(prompt=500, at=0.0), BUSY, QUEUED, 0.5) == pytest.approx(2.80)
    # Priority 1 has nobody ahead: 16 + 0 + 1 - 16 = 1 sequence, 0.25 s, + 0.05 s.
    assert predict_ttft(ask(priority=1, prompt=500), BUSY, QUEUED, 0.0) == pytest.approx(0.30)


def test_slo_refusal_at_once_with_retry_after_from_the_prediction():
    late = admit(ask(prompt=500), replace(BUSY, ttft_slo_s=1.0), QUEUED, 0.0)
    # 2.30 s predicted, 1 s SLO: come back once 1.3 s of work has drained -> 2 s.
    assert isinstance(late, Reject) and late.code == SLO_UNREACHABLE and late.retry_after_s == 2
    assert "predicted time to first token 2.30s exceeds the SLO of 1s" in late.reason
    ok = admit(ask(prompt=500), replace(BUSY, ttft_slo_s=3.0), QUEUED, 0.0)
    assert isinstance(ok, Enqueue) and ok.position == 3 and "predicted TTFT 2.30s" in ok.reason
    # The same ask at priority 1 (0.30 s) meets a 1 s SLO and goes to the head of the queue.
    first = admit(ask(priority=1, prompt=500), replace(BUSY, ttft_slo_s=1.0), QUEUED, 0.0)
    assert isinstance(first, Enqueue) and first.position == 1


def test_no_slo_no_early_refusal_and_no_pace_no_prediction():
    assert isinstance(admit(ask(prompt=500), BUSY, QUEUED, 0.0), Enqueue)  # 2.30 s, but no SLO
    blind = replace(BUSY, completion_sequences_per_s=None, ttft_slo_s=0.1)
    assert predict_ttft(ask(), blind, QUEUED, 0.0) is None
    assert isinstance(admit(ask(), blind, QUEUED, 0.0), Enqueue)


def test_arriving_capacity_counts_when_sooner():
    # Help: 16 sequences in 0.5 s. By then 4/s * 0.5 = 2 have finished, +16 arrive >= 9 needed:
    # room at 0.5 s (not 2.25 s); TTFT = max(0.5, 0.2) + 0.05 = 0.55 s, within a 1 s SLO.
    helped = replace(BUSY, ttft_slo_s=1.0, help_arriving_s=0.5, help_sequences=16)
    assert predict_ttft(ask(prompt=500), helped, QUEUED, 0.0) == pytest.approx(0.55)
    assert isinstance(admit(ask(prompt=500), helped, QUEUED, 0.0), Enqueue)
    # Help too small (4): 9 - 2 - 4 = 3 left after 0.5 s, at 4/s: 0.5 + 0.75 = 1.25 s (< 2.25 s).
    assert predict_ttft(ask(prompt=500), replace(helped, help_sequences=4), QUEUED, 0.0) == pytest.approx(1.30)
    # Help later than completions alone: 2.25 s still wins over 10 s.
    assert predict_ttft(ask(prompt=500), replace(helped, help_arriving_s=10.0), QUEUED, 0.0) == pytest.approx(2.30)


def _burst(capacity: ModelCapacity, n: int) -> tuple[int, int, int]:
    """n asks of n=1 arrive at once; the ingress admits or queues as told. (admitted, queued, refused)"""
    counts = {Admit: 0, Enqueue: 0, Reject: 0}
    waiting: list[Ask] = []
    for i in range(n):
        a = ask(tenant=f"c{i}")
        d = admit(a, replace(capacity, in_flight_sequences=counts[Admit], in_flight_tokens=150 * counts[Admit]),
                  Waiting(tuple(waiting)), 0.0)
        counts[type(d)] += 1
        if isinstance(d, Enqueue):
            waiting.append(a)
    return counts[Admit], counts[Enqueue], counts[Reject]


def test_a_burst_is_held_while_a_standby_is_promoted():
    # The measured case: 1 active replica (16 sequences), a hot standby, 60 requests at once.
    one = ModelCapacity(active_sequences=16, in_flight_sequences=0, in_flight_tokens=0,
                        max_tokens_in_flight=100_000, queue_sequences=16)
    # Without help: 16 run, 16 wait, 60 - 32 = 28 refused.
    assert _burst(one, 60) == (16, 16, 28)
    # Standby up in 0.4 s (<= max_hold_s 1 s), 16 more sequences: the queue may hold 16 + 16.
    helped = replace(one, help_arriving_s=0.4, help_sequences=16, max_hold_s=1.0)
    assert _burst(helped, 60) == (16, 32, 12)  # what two replicas and their queue cannot hold
    assert _burst(replace(helped, help_arriving_s=5.0), 60) == (16, 16, 28)  # too late to wait for
    # Once the standby is active, 16 of the 32 start and the queue is back at its normal bound.
    queue = Waiting(tuple(ask(tenant=f"q{i}") for i in range(32)))
    up = replace(one, active_sequences=32, in_flight_sequences=16, in_flight_tokens=16 * 150)
    assert len(next_to_run(queue, up).asks) == 16


def test_release_is_strict_priority_fifo_within_and_stops_at_a_blocked_head():
    a_low, big_high, c_high = ask(0, 1, tenant="a"), ask(1, 8, tenant="B"), ask(1, 1, tenant="c")
    w = Waiting((a_low, big_high, c_high))

    def free(n):
        return replace(CAP, in_flight_sequences=16 - n)

    assert w.release_order() == (big_high, c_high, a_low)
    # 4 free: B (8) is the head and does not fit; c and a would, but nothing passes the head.
    blocked = next_to_run(w, free(4))
    assert blocked.asks == () and "next (B, priority 1) needs 8 sequences" in blocked.reason
    # 9 free: B (8), then c (1); a (1) no longer fits.
    assert next_to_run(w, free(9)).asks == (big_high, c_high)
    assert next_to_run(w, free(10)).asks == (big_high, c_high, a_low)


def test_expired_after_max_wait_with_retry_after_for_what_is_ahead():
    old, young, oldest_low = ask(1, 2, at=0.0), ask(1, 1, at=25.0), ask(0, 3, at=-5.0)
    w = Waiting((old, young, oldest_low))
    cap = replace(CAP, completion_sequences_per_s=2.0)
    out = expired(w, cap, 30.0, 30.0)
    assert [e.ask for e in out] == [old, oldest_low]  # waited 30 s and 35 s; young only 5 s
    # old: nothing ahead, its own 2 sequences at 2/s -> 1 s. oldest_low: young (1) ahead + 3 -> 2 s.
    assert [e.retry_after_s for e in out] == [1, 2]
    assert out[0].code == "queue_timeout" and "waited 30.0s in the queue (limit 30s)" in out[0].reason


def test_asks_are_validated():
    with pytest.raises(ValueError, match="must be at least 1"):
        ask(sequences=0)
    with pytest.raises(ValueError, match="must not be negative"):
        ask(prompt=-1)


def test_retry_after_stays_finite_at_a_vanishing_pace():
    crawl = replace(CAP, in_flight_sequences=16, queue_sequences=0, completion_sequences_per_s=1e-300)
    assert admit(ask(), crawl, Waiting(), 0.0).retry_after_s == 3600


@given(st.integers(0, 2), st.integers(1, 4), st.integers(0, 2000), st.integers(0, 64), st.integers(0, 64),
       st.none() | st.floats(0.1, 50), st.none() | st.floats(0, 5), st.integers(0, 16))
def test_no_slo_never_refuses_early(priority, n, prompt, in_flight, queued, pace, help_s, help_seq):
    cap = ModelCapacity(16, in_flight, 0, 10**6, 64, prefill_tokens_per_s=1000.0, help_arriving_s=help_s,
                        help_sequences=help_seq, completion_sequences_per_s=pace)
    waiting = Waiting(tuple(ask() for _ in range(queued)))
    d = admit(ask(priority, n, prompt), cap, waiting, 0.0)
    assert not (isinstance(d, Reject) and d.code == SLO_UNREACHABLE)
    # An SLO no prediction can miss changes nothing either (it holds for help as long as the
    # unbounded max_hold_s does).
    unbounded = replace(cap, max_hold_s=math.inf)
    assert (admit(ask(priority, n, prompt), replace(unbounded, ttft_slo_s=math.inf), waiting, 0.0)
            == admit(ask(priority, n, prompt), unbounded, waiting, 0.0))


MAX_WAIT_S = 4.0


class Ingress(RuleBasedStateMachine):
    """A model's ingress as the live one will drive it: admit each arrival, start what is
    admitted or released, release on every finish and when help arrives, expire stale asks."""

    @initialize(per_replica=st.integers(1, 8), replicas=st.integers(0, 2), tokens_per_seq=st.integers(50, 400),
                queue=st.integers(0, 12), help_in=st.none() | st.floats(0, 3), slo=st.none() | st.floats(0.05, 5),
                max_hold=st.none() | st.floats(0, 3), prefill=st.none() | st.floats(100, 1e5),
                pace=st.none() | st.floats(0.1, 50))
    def setup(self, per_replica, replicas, tokens_per_seq, queue, help_in, slo, max_hold, prefill, pace):
        self.per_replica, self.tokens_per_replica = per_replica, per_replica * tokens_per_seq
        self.replicas, self.queue, self.help_at = replicas, queue, help_in
        self.slo, self.max_hold, self.prefill, self.pace = slo, max_hold, prefill, pace
        self.now = 0.0
        self.in_flight: list[Ask] = []
        self.waiting: list[Ask] = []
        self.arrivals = 0
        self.last_started: dict[int, int] = {}  # priority -> serial of the last ask started
        self.accepted = self.finished = self.timed_out = 0

    def cap(self) -> ModelCapacity:
        coming = self.help_at is not None
        return ModelCapacity(
            self.replicas * self.per_replica, sum(a.sequences for a in self.in_flight),
            sum(a.tokens for a in self.in_flight), self.replicas * self.tokens_per_replica, self.queue,
            prefill_tokens_per_s=self.prefill, ttft_slo_s=self.slo,
            help_arriving_s=self.help_at - self.now if coming else None,
            help_sequences=self.per_replica if coming else 0, max_hold_s=self.max_hold,
            completion_sequences_per_s=self.pace)

    def start(self, a: Ask) -> None:
        cap = self.cap()
        assert a.sequences <= cap.free_sequences and a.tokens <= cap.free_tokens
        # A higher priority never waits behind a lower one that starts when both fit.
        assert not any(w.priority > a.priority and w.sequences <= cap.free_sequences
                       and w.tokens <= cap.free_tokens for w in self.waiting)
        # FIFO within a priority.
        serial = int(a.tenant)  # the arrival order, as the tenant's name
        assert serial > self.last_started.get(a.priority, -1)
        self.last_started[a.priority] = serial
        self.in_flight.append(a)

    def release(self) -> None:
        r = next_to_run(Waiting(tuple(self.waiting)), self.cap())
        assert r.reason
        for a in r.asks:
            assert any(a is w for w in self.waiting)
            self.waiting = [w for w in self.waiting if w is not a]
            self.start(a)

    @rule(priority=st.integers(0, 2), n=st.integers(1, 4), prompt=st.integers(0, 500), max_tokens=st.integers(0, 200))
    def arrive(self, priority, n, prompt, max_tokens):
        a = Ask(str(self.arrivals), priority, n, prompt, max_tokens, self.now)
        self.arrivals += 1
        cap, waiting = self.cap(), Waiting(tuple(self.waiting))
        d = admit(a, cap, waiting, self.now)
        assert d.reason
        ahead = sum(1 for w in self.waiting if w.priority >= priority)
        fits = n <= cap.free_sequences and a.tokens <= cap.free_tokens
        assert isinstance(d, Admit) == (fits and not ahead)
        predicted = predict_ttft(a, cap, waiting, self.now)
        after = waiting.sequences + n
        if isinstance(d, Admit):
            self.accepted += 1
            self.start(a)
        elif isinstance(d, Enqueue):
            self.accepted += 1
            assert d.position == ahead + 1
            assert after <= self.queue or (cap.help_in_time and after <= self.queue + self.per_replica)
            assert self.slo is None or predicted is None or predicted <= self.slo
            self.waiting.append(a)
        else:
            assert isinstance(d.retry_after_s, int) and 1 <= d.retry_after_s <= 3600
            if d.code == SLO_UNREACHABLE:
                assert self.slo is not None and predicted is not None and predicted > self.slo
            else:
                assert d.code == QUEUE_FULL and after > cap.queue_bound

    @rule(pick=st.integers(0, 1000))
    def finish(self, pick):
        if self.in_flight:
            self.in_flight.pop(pick % len(self.in_flight))
            self.finished += 1
            self.release()

    @rule(delay=st.floats(0, 3))
    def standby_called(self, delay):
        if self.help_at is None:
            self.help_at = self.now + delay

    @rule(dt=st.floats(0.01, 2))
    def tick(self, dt):
        self.now += dt
        if self.help_at is not None and self.help_at <= self.now:
            self.replicas, self.help_at = self.replicas + 1, None
            self.release()
        out = expired(Waiting(tuple(self.waiting)), self.cap(), self.now, MAX_WAIT_S)
        for e in out:
            assert any(e.ask is w for w in self.waiting) and self.now - e.ask.arrived_at >= MAX_WAIT_S
            assert isinstance(e.retry_after_s, int) and 1 <= e.retry_after_s <= 3600 and e.reason
            self.waiting = [w for w in self.waiting if w is not e.ask]
            self.timed_out += 1
        assert all(self.now - w.arrived_at < MAX_WAIT_S for w in self.waiting)
        self.release()  # an expired head may have blocked asks that fit

    @invariant()
    def within_bounds(self):
        if not hasattr(self, "now"):
            return
        cap = self.cap()
        assert cap.in_flight_sequences <= cap.active_sequences
        assert cap.in_flight_tokens <= cap.max_tokens_in_flight
        assert Waiting(tuple(self.waiting)).sequences <= self.queue + self.per_replica
        # Nothing accepted disappears: it runs, finished, waits, or timed out after MAX_WAIT_S.
        assert self.accepted == len(self.in_flight) + self.finished + len(self.waiting) + self.timed_out
        # Settled: whatever could start has started.
        head = Waiting(tuple(self.waiting)).release_order()[:1]
        assert not any(h.sequences <= cap.free_sequences and h.tokens <= cap.free_tokens for h in head)


Ingress.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_ingress_state_machine = Ingress.TestCase
