"""A model's request rate over its past, read from the service's own Prometheus (issue 38, req 1).

The autoscaler's prior is what its burst envelope learns from a service's past traffic
(autoscale/memory/prior.py). A running service keeps that past in Prometheus already: the front
door exports every request a replica answered (the TTFT histogram's count, per replica) and every
one it refused (`hbmserve_refusals_total`), per model. This adapter asks Prometheus for their sum
each step over a window; the learner turns it into arrivals. `hbmserve autoscale learn
--prometheus` and a config's `autoscaling.prior: {prometheus: URL}` both read it here.

Each replica's counter is differenced on its own before they are summed, so a replica that
stopped, started or restarted (its counter gone, new, or reset) costs nothing. Steps Prometheus
has no sample for count as no traffic.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import httpx

ANSWERED = "hbmserve_time_to_first_token_seconds_count"
REFUSED = "hbmserve_refusals_total"
MAX_POINTS = 11_000  # Prometheus refuses a range query that returns more points per series


class HistoryError(ValueError):
    """The history could not be read, or holds no request: the message says which."""


@dataclass(frozen=True)
class RateHistory:
    step_s: float
    rates: tuple[tuple[float, float], ...]  # (unix time, requests/s over the step before it), every step

    @property
    def requests(self) -> float:
        return sum(r for _, r in self.rates) * self.step_s


def _series(url: str, name: str, model: str, start: float, end: float, step: float,
            timeout_s: float) -> list[list[tuple[float, float]]]:
    """Each series of counter `name` for `model`: its value at every step it had one."""
    query = name + "{model=" + json.dumps(model) + "}"
    try:
        r = httpx.get(f"{url.rstrip('/')}/api/v1/query_range", timeout=timeout_s,
                      params={"query": query, "start": start, "end": end, "step": step})
        body = r.json()
    except (httpx.HTTPError, ValueError) as err:
        raise HistoryError(f"Prometheus at {url}: {err or type(err).__name__}") from None
    if not isinstance(body, dict) or body.get("status") != "success":
        raise HistoryError(f"Prometheus at {url} answered {r.status_code}: {body.get('error', body) if isinstance(body, dict) else body}")
    return [[(float(t), float(v)) for t, v in s["values"] if not math.isnan(float(v))]
            for s in body["data"]["result"]]


def counter_increases(points: list[tuple[float, float]], start: float) -> list[tuple[float, float]]:
    """(time, requests since the previous value) along one counter: a fall is a restart from 0,
    and a series first seen after `start` is a replica that started in the window."""
    out, last = [], None
    for t, v in points:
        if last is None:
            out.append((t, 0.0 if t <= start else v))
        else:
            out.append((t, v - last if v >= last else v))
        last = v
    return out


def request_rates(url: str, model: str, window_s: float, step_s: float, now: float,
                  timeout_s: float = 10.0) -> RateHistory:
    """`model`'s request rate over the `window_s` before `now`, each `step_s` (widened when the
    window would need more points than Prometheus returns). Each counter's raw values are read,
    not `rate()`, which spreads a burst over its window: with `step_s` the scrape interval, each
    step's count is exactly what the scrape at its end saw arrive."""
    step = max(step_s, window_s / MAX_POINTS)
    start = now - window_s
    per_step = [0.0] * (math.floor(window_s / step + 1e-9) + 1)
    for name in (ANSWERED, REFUSED):
        for points in _series(url, name, model, start, now, step, timeout_s):
            for t, n in counter_increases(points, start):
                k = round((t - start) / step)
                if 0 <= k < len(per_step):
                    per_step[k] += n
    history = RateHistory(step, tuple((start + k * step, n / step) for k, n in enumerate(per_step) if k > 0))
    if history.requests < 1:
        raise HistoryError(f"Prometheus at {url} holds no request of model {model!r} in the last {window_s:g} s")
    return history
