"""The engine metrics a replica serves and the front door re-exports as hbmserve_*.

vLLM measures TTFT, TPOT and end-to-end latency inside its engine and keeps them as Prometheus
histograms in its in-process registry; hbmserve reuses those rather than re-measuring from the
stream's timing. A replica serves the families below, under vLLM's names, at `GET /hbm/metrics`
(the internal token, like /hbm/load); the simulated engine keeps the same families under the same
names (sim_metrics.py), so a cluster of `engine: sim` replicas looks the same to Prometheus.
The front door of each node (door_metrics.py) scrapes the replicas of its own node and renames
each family, labelled with the model and the replica: summing over front doors never counts a
replica twice.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from hbmserve.core.histogram import from_buckets
from hbmserve.core.records import Histogram

METRICS_PATH = "/hbm/metrics"

# vLLM family -> the name the front door exports it under. Counters are family names without
# `_total` (prometheus_client adds it to the sample). vLLM labels each with model_name and engine
# (the data-parallel rank); the front door replaces model_name by model and adds replica.
ENGINE_FAMILIES: dict[str, str] = {
    "vllm:num_requests_waiting": "hbmserve_requests_waiting",
    "vllm:num_requests_running": "hbmserve_requests_running",
    "vllm:kv_cache_usage_perc": "hbmserve_kv_cache_usage",
    "vllm:time_to_first_token_seconds": "hbmserve_time_to_first_token_seconds",
    "vllm:request_time_per_output_token_seconds": "hbmserve_time_per_output_token_seconds",
    "vllm:inter_token_latency_seconds": "hbmserve_inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds": "hbmserve_e2e_request_latency_seconds",
    "vllm:prompt_tokens": "hbmserve_prompt_tokens",
    "vllm:generation_tokens": "hbmserve_generation_tokens",
    "vllm:num_preemptions": "hbmserve_preemptions",
    # Prompt tokens looked up in the prefix cache and found there: the per-replica hit rate.
    "vllm:prefix_cache_queries": "hbmserve_prefix_cache_queries",
    "vllm:prefix_cache_hits": "hbmserve_prefix_cache_hits",
}
# Families only an engine with a KV connector has: prompt tokens looked up through the connector
# and loaded from it; on a decode replica of a disaggregated model, the KV that came from the
# prefill replicas (issue 23). Exported where they exist; the simulated engine has none.
CONNECTOR_FAMILIES: dict[str, str] = {
    "vllm:external_prefix_cache_queries": "hbmserve_external_prefix_cache_queries",
    "vllm:external_prefix_cache_hits": "hbmserve_external_prefix_cache_hits",
}
EXPORTED = ENGINE_FAMILIES | CONNECTOR_FAMILIES
TTFT = "vllm:time_to_first_token_seconds"
TPOT = "vllm:request_time_per_output_token_seconds"


def engine_families(collected: Iterable[Metric]) -> list[Metric]:
    """The families of ENGINE_FAMILIES (and CONNECTOR_FAMILIES) among a registry's (vLLM's REGISTRY.collect())."""
    return [m for m in collected if m.name in EXPORTED]


class _Families:
    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def exposition(families: list[Metric]) -> bytes:
    """Prometheus text for `families` (prometheus_client writes it; no hand-made format)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry)


def parse_engine_text(text: str) -> list[Metric]:
    """A replica's /hbm/metrics reply back into families: only ENGINE_FAMILIES, without the
    `_created` samples (a start time, not a measurement)."""
    return [m for m in text_string_to_metric_families(text) if m.name in EXPORTED]


def relabel(families: Iterable[Metric], model: str, replica: str, pool: str | None = None) -> list[Metric]:
    """Each family under its hbmserve name, `model_name` replaced by `model`, with `replica`;
    and `pool` (prefill, decode) for a replica of a disaggregated model."""
    out = []
    for family in families:
        new = EXPORTED[family.name]
        renamed = Metric(new, family.documentation, family.type)
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            labels = {k: v for k, v in s.labels.items() if k != "model_name"} | {"model": model, "replica": replica}
            if pool is not None:
                labels["pool"] = pool
            renamed.add_sample(new + s.name[len(family.name):], labels, s.value, s.timestamp, s.exemplar)
        out.append(renamed)
    return out


def histogram_of(families: Iterable[Metric], name: str) -> Histogram | None:
    """Family `name`'s buckets summed over its engines (data-parallel ranks); None if absent or
    empty."""
    buckets, total = [], 0.0
    for family in families:
        if family.name != name:
            continue
        for s in family.samples:
            if s.name == name + "_bucket":
                buckets.append((float(s.labels["le"]), s.value))
            elif s.name == name + "_sum":
                total += s.value
    return from_buckets(buckets, total) if buckets else None
