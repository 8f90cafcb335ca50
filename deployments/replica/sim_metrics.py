"""The simulated engine's metrics under vLLM's names, so that `engine: sim` replicas export what
vLLM replicas export (engine_metrics.ENGINE_FAMILIES) and tests of the metrics path need no vLLM.

Each replica has its own CollectorRegistry (no global registry: several simulated replicas may
share a process in tests). Timings are the engine's: from the request reaching the engine to its
first and last token, as vLLM measures them, observed by sim_server.py as tokens leave the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from hbmserve.deployments.wire.engine_metrics import engine_families

# vLLM 0.32's default buckets (vllm/v1/metrics/buckets.py), copied: importing vLLM to read them
# costs a sim replica seconds and gigabytes.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                       20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)
_LABELS = ("model_name", "engine")


@dataclass(frozen=True)
class GaugeStats:
    """What the engine reports when scraped; the counters count since the engine started."""

    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0  # 0..1
    preemptions: int = 0
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hits: int = 0  # of those, found


class _EngineGauges:
    """Queue, batch, KV, preemptions and prefix-cache counters read from the engine when scraped,
    as vLLM's are."""

    def __init__(self, labels: tuple[str, str], stats: Callable[[], GaugeStats]):
        self.labels, self.stats = labels, stats

    def collect(self) -> list[Metric]:
        s = self.stats()
        out: list[Metric] = []
        for name, doc, value in (("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                                  s.waiting),
                                 ("vllm:num_requests_running", "Number of requests in model execution batches.",
                                  s.running),
                                 ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.kv_usage)):
            g = GaugeMetricFamily(name, doc, labels=_LABELS)
            g.add_metric(self.labels, value)
            out.append(g)
        for name, doc, value in (("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                                  s.preemptions),
                                 ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried "
                                  "tokens.", s.prefix_queries),
                                 ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                                  s.prefix_hits)):
            c = CounterMetricFamily(name, doc, labels=_LABELS)
            c.add_metric(self.labels, value)
            out.append(c)
        return out


class SimEngineMetrics:
    def __init__(self, model_name: str, stats: Callable[[], GaugeStats]):
        """`stats`: the engine's gauges and counters as of now."""
        self.registry = CollectorRegistry(auto_describe=False)
        labels = (model_name, "0")
        r = self.registry

        def hist(name: str, doc: str, buckets: tuple[float, ...]):
            return Histogram(name, doc, _LABELS, registry=r, buckets=buckets).labels(*labels)

        self.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                         TTFT_BUCKETS)
        self.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                        INTER_TOKEN_BUCKETS)
        self.tpot = hist("vllm:request_time_per_output_token_seconds",
                         "Histogram of time_per_output_token_seconds per request.", INTER_TOKEN_BUCKETS)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                        REQUEST_LATENCY_BUCKETS)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", _LABELS,
                                     registry=r).labels(*labels)
        self.generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.",
                                         _LABELS, registry=r).labels(*labels)
        # The KV a decode replica loaded from a prefill replica (disaggregated serving), under
        # the names vLLM's connectors count it by (engine_metrics.CONNECTOR_FAMILIES).
        self.external_queries = Counter("vllm:external_prefix_cache_queries", "External prefix cache queries, in "
                                        "terms of number of queried tokens.", _LABELS, registry=r).labels(*labels)
        self.external_hits = Counter("vllm:external_prefix_cache_hits", "External prefix cache hits, in terms of "
                                     "number of cached tokens.", _LABELS, registry=r).labels(*labels)
        r.register(_EngineGauges(labels, stats))

    def request(self, arrived: float, prompt_tokens: int) -> RequestTimer:
        return RequestTimer(self, arrived, prompt_tokens)

    def families(self) -> list[Metric]:
        return engine_families(self.registry.collect())


class RequestTimer:
    """One request's engine timings, observed as its tokens leave the engine (seconds on one
    monotonic clock). Tokens count as they are produced, latencies once the request finishes,
    as in vLLM."""

    def __init__(self, metrics: SimEngineMetrics, arrived: float, prompt_tokens: int):
        self.m, self.arrived, self.prompt_tokens = metrics, arrived, prompt_tokens
        self.first: float | None = None
        self.last = arrived
        self.tokens = 0

    def token(self, at: float) -> None:
        if self.first is None:
            self.first = at
            self.m.ttft.observe(at - self.arrived)
            self.m.prompt_tokens.inc(self.prompt_tokens)  # the prefill is done
        else:
            self.m.itl.observe(at - self.last)
        self.m.generation_tokens.inc()
        self.last = at
        self.tokens += 1

    def finish(self) -> None:
        self.m.e2e.observe(self.last - self.arrived)
        if self.first is not None and self.tokens > 1:
            self.m.tpot.observe((self.last - self.first) / (self.tokens - 1))
