"""Per-adapter figures at one front door (issue 25): requests by status, tokens, time to first
token, and the loads and unloads of the replicas on its node.

An adapter shares its base model's engines, so the engine families (labelled by model) cannot
tell adapters apart; the door can, because it reads each request's `model`. Requests, tokens and
TTFT are this door's own traffic (summing over doors counts each request once); loads, unloads
and residency come from the load reports of the replicas on this door's node (as the engine
families do, so no replica is counted twice). The dashboard reads the same windows for its
per-adapter table.
"""

from __future__ import annotations

import bisect
import time
from collections import Counter
from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from hbmserve.core.config import ClusterSpec
from hbmserve.core.records import AdapterHolding
from hbmserve.core.door_records import AdapterTraffic
from hbmserve.deployments.ingress.dashboard_feed import ReplyWatch, ReplyWindow
from hbmserve.deployments.ingress.usage_tap import UsageTap

# TTFT buckets, seconds: vLLM's time_to_first_token_seconds buckets up to a minute.
TTFT_BOUNDS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class AdapterStats:
    """One adapter's replies: a ReplyWatch's window (for the dashboard's p95s) and a TTFT histogram."""

    def __init__(self) -> None:
        self.window = ReplyWindow()
        self.ttft_buckets = [0] * (len(TTFT_BOUNDS_S) + 1)  # the last: above every bound
        self.ttft_sum_s = 0.0
        self.requests: Counter[str] = Counter()  # by HTTP status ("200", "429", ...)
        self.tokens: Counter[str] = Counter()  # prompt, completion

    def record(self, at: float, ttft_s: float | None, tpot_s: float | None, output_tokens: int) -> None:
        self.window.record(at, ttft_s, tpot_s, output_tokens)
        if ttft_s is not None:
            self.ttft_buckets[bisect.bisect_left(TTFT_BOUNDS_S, ttft_s)] += 1
            self.ttft_sum_s += ttft_s


class AdapterMeter:
    def __init__(self, spec: ClusterSpec, clock=time.monotonic) -> None:
        self.clock = clock
        self.stats: dict[str, AdapterStats] = {}
        self.base: dict[str, str] = {}  # adapter -> its model
        self.update(spec)

    def update(self, spec: ClusterSpec) -> None:
        """Meter the adapters of `spec` (a reloaded config): a new one starts at zero, one kept
        keeps its counts, one removed stops being exported."""
        self.base = {a.name: m.name for m in spec.models for a in m.adapters}
        self.stats = {name: self.stats.get(name) or AdapterStats() for name in self.base}

    def watch(self, adapter: str, send, arrived_at: float, request_bytes: int):
        """`send`, timing the reply for `adapter`'s TTFT (as the dashboard times its model's)."""
        return ReplyWatch(send, self.stats.setdefault(adapter, AdapterStats()), arrived_at, request_bytes, self.clock)

    def settle(self, adapter: str, tap: UsageTap) -> None:
        """A request for `adapter` ended: count it by status and its tokens (the engine's usage)."""
        s = self.stats.setdefault(adapter, AdapterStats())
        s.requests[str(tap.status or 499)] += 1  # no reply reached the client: it left (nginx's 499)
        if tap.usage is not None:
            s.tokens["prompt"] += tap.usage.prompt_tokens
            s.tokens["completion"] += tap.usage.completion_tokens

    def traffic(self, model: str, holdings: Iterable[AdapterHolding]) -> tuple[AdapterTraffic, ...]:
        """`model`'s adapters as `status` and the dashboard show them; `holdings`: its replicas on
        this node."""
        held = list(holdings)
        now = self.clock()
        out = []
        for name in (a for a, m in self.base.items() if m == model):
            s = self.stats[name]
            out.append(AdapterTraffic(
                model=model, adapter=name, requests=sum(s.requests.values()),
                failed=sum(n for code, n in s.requests.items() if code != "200"),
                prompt_tokens=s.tokens["prompt"], completion_tokens=s.tokens["completion"],
                ttft_p95_s=s.window.figures(now).ttft_p95_s,
                loads=sum(n for h in held for a, n in h.loads if a == name),
                unloads=sum(n for h in held for a, n in h.unloads if a == name),
                resident=sum(name in h.resident for h in held)))
        return tuple(out)

    def families(self, holdings: Iterable[tuple[str, AdapterHolding]]) -> list[Metric]:
        """The /metrics families; `holdings`: (model, adapters) of the replicas on this node."""
        labels = ("model", "adapter")
        requests = CounterMetricFamily("hbmserve_adapter_requests", "Requests naming a LoRA adapter, by HTTP status "
                                       "of the reply (499: the client left first)", labels=(*labels, "code"))
        tokens = CounterMetricFamily("hbmserve_adapter_tokens", "Tokens of requests naming a LoRA adapter, as the "
                                     "engine reported them", labels=(*labels, "kind"))
        ttft = HistogramMetricFamily("hbmserve_adapter_ttft_seconds", "Time to first token of streamed replies for "
                                     "a LoRA adapter, as the client saw it", labels=labels)
        for name, model in self.base.items():
            s, key = self.stats[name], (model, name)
            for code, n in sorted(s.requests.items()):
                requests.add_metric((*key, code), n)
            for kind in ("prompt", "completion"):
                tokens.add_metric((*key, kind), s.tokens[kind])
            cumulative, running = [], 0
            for bound, n in zip((*map(str, TTFT_BOUNDS_S), "+Inf"), s.ttft_buckets):
                running += n
                cumulative.append((bound, running))
            ttft.add_metric(key, cumulative, s.ttft_sum_s)
        loads = CounterMetricFamily("hbmserve_adapter_loads", "LoRA adapters registered in an engine on demand, by "
                                    "the replicas on this node", labels=labels)
        unloads = CounterMetricFamily("hbmserve_adapter_unloads", "LoRA adapters evicted from an engine to free a "
                                      "slot, by the replicas on this node", labels=labels)
        resident = GaugeMetricFamily("hbmserve_adapter_resident_replicas", "Replicas on this node holding the "
                                     "adapter now", labels=labels)
        counts = {k: Counter() for k in ("loads", "unloads", "resident")}
        for model, h in holdings:
            counts["loads"].update({(model, a): n for a, n in h.loads})
            counts["unloads"].update({(model, a): n for a, n in h.unloads})
            counts["resident"].update((model, a) for a in h.resident)
        for family, kind in ((loads, "loads"), (unloads, "unloads"), (resident, "resident")):
            for name, model in self.base.items():
                family.add_metric((model, name), counts[kind][(model, name)])
        return [requests, tokens, ttft, loads, unloads, resident]
