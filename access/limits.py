"""Per-tenant rate limits as token buckets. Pure: time comes in as `now` (monotonic seconds).

A bucket holds at most one minute's worth (capacity = the per-minute limit) and refills
continuously at capacity / 60 per second: a quiet tenant may burst a whole minute's allowance
at once, a busy one gets the steady rate, and over any window of `w` seconds no more than
`capacity + capacity * w / 60` is let through. Each tenant has two buckets: requests (each
request costs 1) and tokens (a request costs the most it may use, `Generation.most_tokens`, and is
`settle`d with what the engine reports it used once it ends: the unused part comes back, an
overrun is owed). A request goes through only if both can pay; a refused request pays neither,
so retrying costs nothing.

Several front doors (one per node) admit for one cluster, each with its own buckets. Each holds
a `doors`-th of every limit (capacity and refill), as admission splits a model's capacity
(deployments/ingress/front_door_queue.py), so together they admit at most the tenant's limit over any
window, without a shared store on the request path. The price: a request larger than one
door's share can never be admitted (TooLarge, saying so), and a tenant whose clients all reach
one door gets that door's share only.

Three outcomes, because they need different answers:
* `Allowed`: go on.
* `Limited`: 429 with Retry-After; retrying after `retry_after_s` succeeds if the tenant sends
  nothing else meanwhile (the wait is rounded up to whole seconds, as Retry-After is).
* `TooLarge`: the request alone costs more than a whole minute's allowance. No wait would
  admit it, so it gets no Retry-After; the client must ask for less (max_tokens, n).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hbmserve.access.keys import Tenant

# Float slack when comparing a cost with a bucket's level, relative to the capacity: a wait
# computed as (cost - level) / rate must admit the retry even after rounding.
_SLACK = 1e-9


@dataclass(frozen=True)
class Bucket:
    tokens: float
    updated_at: float


@dataclass(frozen=True)
class Allowed:
    reason: str


@dataclass(frozen=True)
class Limited:
    reason: str
    retry_after_s: int  # >= 1


@dataclass(frozen=True)
class TooLarge:
    reason: str


Decision = Allowed | Limited | TooLarge


def level(bucket: Bucket | None, capacity_per_minute: int, now: float) -> float:
    """How much `bucket` holds at `now`; None is a bucket never drawn from, so full."""
    if bucket is None:
        return float(capacity_per_minute)
    elapsed = max(0.0, now - bucket.updated_at)  # a clock read out of order refills nothing
    return min(float(capacity_per_minute), bucket.tokens + elapsed * capacity_per_minute / 60)


def take(bucket: Bucket | None, capacity_per_minute: int | None, cost: float, now: float,
         *, what: str = "tokens", doors: int = 1) -> tuple[Decision, Bucket | None]:
    """Draw `cost` from `bucket` at `now`, at one of `doors` front doors (it holds a `doors`-th of
    the limit). A refusal returns `bucket` unchanged (charges nothing). `capacity_per_minute`
    None is no limit; `what` names the unit in the reason."""
    if capacity_per_minute is None:
        return Allowed(f"no {what} limit"), bucket
    if cost > capacity_per_minute:
        return TooLarge(f"Request too large: it needs {cost:g} {what} and the limit is {capacity_per_minute} "
                        f"{what} per minute, so it can never be admitted; ask for fewer."), bucket
    cap = capacity_per_minute / doors
    if cost > cap:
        return TooLarge(f"Request too large: it needs {cost:g} {what}; the limit of {capacity_per_minute} {what} "
                        f"per minute is split between this cluster's {doors} front doors, so each admits at most "
                        f"{math.floor(cap)} at once; ask for fewer."), bucket
    have = level(bucket, cap, now)
    if cost <= have + cap * _SLACK:
        updated_at = now if bucket is None else max(now, bucket.updated_at)
        return Allowed(f"{cost:g} of {have:.0f} {what} left"), Bucket(max(0.0, have - cost), updated_at)
    # The same slack as the admission check above: without it, float error in an exact whole
    # second (78.8 tokens at 197/min is 24.000000000000004 s) asked the client to wait a second more.
    retry_after_s = max(1, math.ceil((cost - have - cap * _SLACK) * 60 / cap))
    return Limited(f"Rate limit reached for {what} per minute: limit {capacity_per_minute}, available "
                   f"{max(0, math.floor(have))}, requested {cost:g}. Please try again in {retry_after_s}s.",
                   retry_after_s), bucket


def settle(bucket: Bucket | None, capacity_per_minute: int | None, refund: float, now: float,
           doors: int = 1) -> Bucket | None:
    """`bucket` after a request that was charged `refund` more than it used (negative: it used
    more than it was charged, and the tenant owes it). The level stays within one share's minute
    either way: a debt is paid by waiting, and never grows without bound."""
    if capacity_per_minute is None:
        return bucket
    cap = capacity_per_minute / doors
    have = level(bucket, cap, now)
    updated_at = now if bucket is None else max(now, bucket.updated_at)
    return Bucket(min(cap, max(-cap, have + refund)), updated_at)


@dataclass(frozen=True)
class TenantLimits:
    """One tenant's two buckets. Build it with `TenantLimits.of(tenant)`; `take` returns the
    decision and the state to keep (unchanged when refused)."""

    requests_per_minute: int | None
    tokens_per_minute: int | None
    requests: Bucket | None = None  # None: not drawn from yet (full)
    tokens: Bucket | None = None

    @classmethod
    def of(cls, tenant: Tenant) -> TenantLimits:
        return cls(tenant.requests_per_minute, tenant.tokens_per_minute)

    def take(self, tokens: int, now: float, doors: int = 1) -> tuple[Decision, TenantLimits]:
        """Admit one request that may use `tokens` at `now`, at one of `doors`
        front doors, or refuse it."""
        by_requests, requests = take(self.requests, self.requests_per_minute, 1, now, what="requests", doors=doors)
        by_tokens, tokens_bucket = take(self.tokens, self.tokens_per_minute, tokens, now, what="tokens",
                                        doors=doors)
        refusals = [d for d in (by_requests, by_tokens) if not isinstance(d, Allowed)]
        if not refusals:
            return Allowed(f"{by_requests.reason}; {by_tokens.reason}"), replace(
                self, requests=requests, tokens=tokens_bucket)
        too_large = [d for d in refusals if isinstance(d, TooLarge)]
        if too_large:  # no wait helps, whatever the other bucket says
            return too_large[0], self
        return max(refusals, key=lambda d: d.retry_after_s), self

    def settle(self, charged: int, used: int, now: float, doors: int = 1) -> TenantLimits:
        """The limits after a request charged `charged` tokens ended having used `used`."""
        return replace(self, tokens=settle(self.tokens, self.tokens_per_minute, charged - used, now, doors))

    def under(self, tenant: Tenant) -> TenantLimits:
        """These buckets under `tenant`'s limits (a reloaded keys file may change them)."""
        return replace(self, requests_per_minute=tenant.requests_per_minute, tokens_per_minute=tenant.tokens_per_minute)
