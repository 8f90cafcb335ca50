"""A front door's `GET /metrics` (admin token): the Prometheus view of its own node.

What one front door exports, each family once:
* the engine families of the replicas on its node (engine_metrics.py), renamed hbmserve_* and
  labelled model and replica; a replica on another node is that node's front door's business,
  so summing any family over the front doors never counts a replica twice;
* its own: refusals by model, reason and tenant, requests held in its queues, streams moved
  to another replica mid-stream (migration.py), the hourly price of the replicas on its node,
  and each model's SLO (so a dashboard draws it beside the
  p95 it bounds; every front door exports it, so take `max`, not `sum`);
* its KV index per model (deployments/kv): blocks by tier, lag, streams, untrusted replicas,
  event batches applied / stale / unreadable, gaps replayed or reset, and the time spent
  hashing prompts; every door keeps its own index, so these are per door (`instance`);
* GPU gauges from NVML where the node has GPUs (GpuCollector, below), nothing elsewhere.
The cluster-wide figures the autoscaling policy knows (replicas by role, target, last action)
are Ray gauges (records_store.DecisionLog), on Ray's metrics port.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from hbmserve.core.config import SLO
from hbmserve.deployments.wire.engine_metrics import METRICS_PATH, exposition, parse_engine_text, relabel
from hbmserve.deployments.wire.http import INTERNAL_TOKEN_HEADER
from hbmserve.deployments.wire.names import pool_key
from hbmserve.deployments.ingress.replica_table import KnownReplica, ReplicaTable
from hbmserve.deployments.kv.door_kv import KvDoorStats
from hbmserve.placement.io.nvml_discovery import load_pynvml

log = logging.getLogger("hbmserve.frontdoor")

SCRAPE_TIMEOUT_S = 2.0
NO_MODEL = "-"  # a refusal before the model was known (auth, a malformed body)
NO_TENANT = "-"  # a refusal before a key was checked, or with auth off


@dataclass(frozen=True)
class RefusalKey:
    model: str
    reason: str  # the OpenAI error code of the answer (rate_limit_exceeded, queue_full, ...)
    tenant: str


class Refusals:
    """Every error answer of a front door, counted by model, reason and tenant."""

    def __init__(self) -> None:
        self.counts: Counter[RefusalKey] = Counter()

    def note(self, model: str | None, reason: str, tenant: str | None) -> None:
        self.counts[RefusalKey(model or NO_MODEL, reason, tenant or NO_TENANT)] += 1


def merge_families(families: Iterable[Metric]) -> list[Metric]:
    """One family per name, the samples of every replica's family of that name together: the
    text format allows each name once."""
    merged: dict[str, Metric] = {}
    for f in families:
        into = merged.get(f.name)
        if into is None:
            into = merged[f.name] = Metric(f.name, f.documentation, f.type)
        into.samples.extend(f.samples)
    return list(merged.values())


def door_families(refusals: Refusals, queued: dict[str, int], local: Iterable[KnownReplica],
                  usd_per_replica_hour: dict[str, float | None], slos: Mapping[str, SLO],
                  migrations: Mapping[str, Mapping[str, int]] | None = None,
                  kv: Mapping[str, KvDoorStats] | None = None,
                  two_phase: Mapping[str, Mapping[str, int]] | None = None) -> list[Metric]:
    """The front door's own families (pure: tests call it with plain data). `usd_per_replica_hour`
    is keyed by names.pool_key (a model, or one pool of a disaggregated model). `migrations`:
    outcome ("resumed", "failed") -> model -> broken streams (migration.py). `kv`: model -> its
    KV routing at this door (deployments/kv/door_kv.py). `two_phase`: model -> outcome ->
    requests of a disaggregated model (two_phase.py)."""
    refused = CounterMetricFamily("hbmserve_refusals", "Requests a front door answered with an error instead of "
                                  "serving, by OpenAI error code", labels=("model", "reason", "tenant"))
    for key, n in sorted(refusals.counts.items(), key=lambda kv: (kv[0].model, kv[0].reason, kv[0].tenant)):
        refused.add_metric((key.model, key.reason, key.tenant), n)
    held = GaugeMetricFamily("hbmserve_door_queued_requests", "Requests a front door holds, waiting for a "
                             "replica (scale from zero, bursts)", labels=("model",))
    for model, n in sorted(queued.items()):
        held.add_metric((model,), n)
    replicas: Counter[str] = Counter(pool_key(r.endpoint.model, r.endpoint.role) for r in local)
    cost = GaugeMetricFamily("hbmserve_cost_usd_per_hour", "Hourly price of the GPUs of this node's running "
                             "replicas (catalog or hardware.usd_per_gpu_hour)", labels=("model",))
    by_model: dict[str, float] = {}
    for key, price in usd_per_replica_hour.items():  # by pool_key: a disaggregated model's pools apart
        if price is not None:
            model = key.partition("#")[0]
            by_model[model] = by_model.get(model, 0.0) + replicas[key] * price
    for model, usd in sorted(by_model.items()):
        cost.add_metric((model,), usd)
    slo = GaugeMetricFamily("hbmserve_slo_seconds", "The model's latency SLO from the cluster config: p95 "
                            "time to first token (ttft) and per output token (tpot)", labels=("model", "kind"))
    for model, s in sorted(slos.items()):
        slo.add_metric((model, "ttft"), s.ttft_p95_ms / 1000)
        slo.add_metric((model, "tpot"), s.tpot_p95_ms / 1000)
    moved = CounterMetricFamily("hbmserve_door_migrations", "Streams whose replica failed mid-stream: resumed on "
                                "another replica, or failed (migration limit spent)", labels=("model", "outcome"))
    for outcome, by_model in sorted((migrations or {}).items()):
        for model, n in sorted(by_model.items()):
            moved.add_metric((model, outcome), n)
    split = CounterMetricFamily("hbmserve_disagg_requests", "A disaggregated model's requests by how they ran: "
                                "two_phase (prefilled, then decoded with the KV), prefill_failed (a prefill tried "
                                "again elsewhere), aggregated_* (run whole on one replica, and why)",
                                labels=("model", "outcome"))
    for model, outcomes in sorted((two_phase or {}).items()):
        for outcome, n in sorted(outcomes.items()):
            split.add_metric((model, outcome), n)
    return [refused, held, cost, slo, moved, split, *kv_families(kv or {})]


def kv_families(kv: Mapping[str, KvDoorStats]) -> list[Metric]:
    """The door's KV index per model: what it holds, how far behind and how trusted it is, what
    was lost on the way, and what hashing prompts as the engines do costs the door."""
    blocks = GaugeMetricFamily("hbmserve_kv_index_blocks", "KV blocks the door's index holds for the model's "
                               "replicas, by tier (hbm, host), from the engines' KV events", labels=("model", "tier"))
    lag = GaugeMetricFamily("hbmserve_kv_index_lag_seconds", "The largest delay of a replica's last KV event "
                            "batch at the door's index", labels=("model",))
    streams = GaugeMetricFamily("hbmserve_kv_index_streams", "Replicas whose KV event stream is connected to this "
                                "door", labels=("model",))
    distrusted = GaugeMetricFamily("hbmserve_kv_index_untrusted_replicas", "Replicas whose view the router ignores "
                                   "now (a gap being replayed, lag past the bound, no events yet): routed on load",
                                   labels=("model",))
    batches = CounterMetricFamily("hbmserve_kv_event_batches", "KV event batches that reached the door's index: "
                                  "applied, stale (duplicate or older) or unreadable (dropped)",
                                  labels=("model", "outcome"))
    gaps = CounterMetricFamily("hbmserve_kv_index_gaps", "Gaps in a replica's KV event sequence: replayed from "
                               "the engine, or reset (the engine no longer buffered them; the view restarted)",
                               labels=("model", "outcome"))
    overflowed = CounterMetricFamily("hbmserve_kv_index_overflowed_blocks", "Blocks the index let go of to stay "
                                     "within its memory bound", labels=("model",))
    hashed = CounterMetricFamily("hbmserve_door_prompt_hashes", "Requests whose prompt the door tokenized and "
                                 "hashed as the engines do", labels=("model",))
    hash_s = CounterMetricFamily("hbmserve_door_prompt_hash_seconds", "The door's time tokenizing and hashing "
                                 "those prompts", labels=("model",))
    for model, k in sorted(kv.items()):
        i = k.index
        blocks.add_metric((model, "hbm"), i.hbm_hashes)
        blocks.add_metric((model, "host"), i.host_hashes)
        lag.add_metric((model,), i.max_lag_s)
        streams.add_metric((model,), k.streams)
        distrusted.add_metric((model,), len(i.distrusted))
        for outcome, n in (("applied", i.batches), ("stale", i.stale_batches), ("unreadable", k.unreadable)):
            batches.add_metric((model, outcome), n)
        gaps.add_metric((model, "replayed"), i.gaps - i.resets)
        gaps.add_metric((model, "reset"), i.resets)
        overflowed.add_metric((model,), i.overflowed)
        hashed.add_metric((model,), k.hashed)
        hash_s.add_metric((model,), k.hash_s)
    return [blocks, lag, streams, distrusted, batches, gaps, overflowed, hashed, hash_s]


async def _replica_families(session, r: KnownReplica, token: str) -> list[Metric]:
    import aiohttp

    try:
        async with session.get(r.endpoint.url + METRICS_PATH, headers={INTERNAL_TOKEN_HEADER.decode(): token},
                               timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S)) as resp:
            if resp.status != 200:
                return []
            text = (await resp.read()).decode()
    except (aiohttp.ClientError, asyncio.TimeoutError):
        log.debug("no metrics from replica %s of %s", r.endpoint.replica, r.endpoint.model)
        return []
    return relabel(parse_engine_text(text), r.endpoint.model, r.endpoint.replica, r.endpoint.role)


def local_replicas(table: ReplicaTable, node_id: str) -> list[KnownReplica]:
    return [r for replicas in table.replicas.values() for r in replicas.values() if r.endpoint.node_id == node_id]


async def node_metrics(session, token: str, local: list[KnownReplica], own: list[Metric],
                       gpus: Callable[[], list[Metric]] | None) -> bytes:
    """The whole /metrics reply: the local replicas' engine families (scraped now, concurrently),
    the door's own families and the GPU families."""
    scraped = await asyncio.gather(*(_replica_families(session, r, token) for r in local))
    engine = merge_families(f for families in scraped for f in families)
    gpu = await asyncio.to_thread(gpus) if gpus is not None else []  # NVML calls block
    return exposition(engine + own + gpu)


# ---- GPU gauges through NVML (nvidia-ml-py), on GPU nodes ----
# GPU gauges through NVML (nvidia-ml-py), for the front door's /metrics on GPU nodes.
#
# Absent cleanly elsewhere: `GpuCollector.open()` answers None where pynvml is missing or NVML
# does not initialise (no driver, no GPU), and the front door then exports no GPU families at all
# rather than zeros that would read as idle GPUs. `nvml` may be any object with pynvml's function
# names (tests pass a fake built from real machine shapes).
# NVML field ids (nvml.h NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX): KiB of data sent and received
# over NVLink since the driver loaded, a counter. Scope UINT_MAX asks for the sum over all links.
_NVLINK_TX, _NVLINK_RX, _ALL_LINKS = 138, 139, 0xFFFFFFFF
_GPU_LABELS = ("gpu", "uuid")


class GpuCollector:
    """A prometheus_client collector over the GPUs NVML sees on this node."""

    def __init__(self, nvml: Any):
        self.nvml = nvml

    @classmethod
    def open(cls, nvml: Any = None) -> GpuCollector | None:
        """A collector, or None (logged once, with the reason) where NVML cannot be used."""
        try:
            nvml = load_pynvml() if nvml is None else nvml
            nvml.nvmlInit()
        except ImportError:
            log.info("no GPU metrics: nvidia-ml-py is not installed")
            return None
        except Exception as err:  # noqa: BLE001 - pynvml.NVMLError (no driver, no GPU) or a missing libnvidia-ml
            log.info("no GPU metrics: NVML did not initialise (%s)", err)
            return None
        return cls(nvml)

    def close(self) -> None:
        self.nvml.nvmlShutdown()

    def _nvlink_kib(self, handle: Any) -> tuple[float, float] | None:
        """(sent, received) KiB over all NVLinks, or None where the GPU has no NVLink counters."""
        n = self.nvml
        try:
            values = n.nvmlDeviceGetFieldValues(handle, [(_NVLINK_TX, _ALL_LINKS), (_NVLINK_RX, _ALL_LINKS)])
        except n.NVMLError:
            return None
        if any(v.nvmlReturn != n.NVML_SUCCESS for v in values):
            return None
        return float(values[0].value.ullVal), float(values[1].value.ullVal)

    def collect(self) -> list[Metric]:
        n = self.nvml
        util = GaugeMetricFamily("hbmserve_gpu_utilization", "Fraction of the last sample period a kernel ran "
                                 "on the GPU (NVML utilization.gpu / 100)", labels=_GPU_LABELS)
        used = GaugeMetricFamily("hbmserve_gpu_memory_used_bytes", "GPU memory in use (NVML)", labels=_GPU_LABELS)
        total = GaugeMetricFamily("hbmserve_gpu_memory_total_bytes", "GPU memory installed (NVML)", labels=_GPU_LABELS)
        nvlink = CounterMetricFamily("hbmserve_gpu_nvlink_bytes", "Data bytes over all NVLinks of the GPU since the "
                                     "driver loaded; rate() is the throughput", labels=(*_GPU_LABELS, "direction"))
        for i in range(n.nvmlDeviceGetCount()):
            h = n.nvmlDeviceGetHandleByIndex(i)
            uuid = n.nvmlDeviceGetUUID(h)
            labels = (str(i), uuid.decode() if isinstance(uuid, bytes) else uuid)
            util.add_metric(labels, n.nvmlDeviceGetUtilizationRates(h).gpu / 100.0)
            memory = n.nvmlDeviceGetMemoryInfo(h)
            used.add_metric(labels, float(memory.used))
            total.add_metric(labels, float(memory.total))
            kib = self._nvlink_kib(h)
            if kib is not None:
                nvlink.add_metric((*labels, "tx"), kib[0] * 1024)
                nvlink.add_metric((*labels, "rx"), kib[1] * 1024)
        return [util, used, total] + ([nvlink] if nvlink.samples else [])
