"""Admission at one replica: accept a request now, or refuse it with a reason and a Retry-After.
Pure. Each replica keeps this cap as a safety net (`admit_to_replica`); clients meet the ingress
queue's `admit` (queue.py), per model.

A replica accepts up to `max_in_flight` requests: the engine's running batch plus a bounded
queue. Past that, waiting would only grow TTFT for everyone already accepted, so the
request is refused with 429 and a Retry-After sized to drain the excess at the observed pace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class AdmissionBudget:
    max_in_flight: int
    # Fallback when no request has finished yet and the pace is unknown.
    default_retry_after_s: float = 1.0


@dataclass(frozen=True)
class AdmissionLoad:
    in_flight: int
    # Requests finished per second over the recent window; None before any finished.
    completion_rate_rps: float | None = None


@dataclass(frozen=True)
class Admit:
    reason: str


@dataclass(frozen=True)
class Reject:
    reason: str
    retry_after_s: int
    # The OpenAI error code of the 429 reply; the ingress queue (queue.py) adds its own.
    code: str = "overloaded"


def admit_to_replica(load: AdmissionLoad, budget: AdmissionBudget) -> Admit | Reject:
    if load.in_flight < budget.max_in_flight:
        return Admit(reason=f"{load.in_flight + 1}/{budget.max_in_flight} in flight")
    excess = load.in_flight - budget.max_in_flight + 1
    if load.completion_rate_rps:
        wait = excess / load.completion_rate_rps
    else:
        wait = budget.default_retry_after_s
    return Reject(
        reason=f"replica at capacity: {load.in_flight} requests in flight (limit {budget.max_in_flight})",
        retry_after_s=max(1, math.ceil(wait)),
    )
