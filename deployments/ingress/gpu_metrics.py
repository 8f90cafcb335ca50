"""GPU gauges through NVML (nvidia-ml-py), for the front door's /metrics on GPU nodes.

Absent cleanly elsewhere: `GpuCollector.open()` answers None where pynvml is missing or NVML
does not initialise (no driver, no GPU), and the front door then exports no GPU families at all
rather than zeros that would read as idle GPUs. `nvml` may be any object with pynvml's function
names (tests pass a fake built from real machine shapes).
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from hbmserve.placement.io.nvml_discovery import load_pynvml

log = logging.getLogger("hbmserve.frontdoor")

# NVML field ids (nvml.h NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX): KiB of data sent and received
# over NVLink since the driver loaded, a counter. Scope UINT_MAX asks for the sum over all links.
_NVLINK_TX, _NVLINK_RX, _ALL_LINKS = 138, 139, 0xFFFFFFFF
_LABELS = ("gpu", "uuid")


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
                                 "on the GPU (NVML utilization.gpu / 100)", labels=_LABELS)
        used = GaugeMetricFamily("hbmserve_gpu_memory_used_bytes", "GPU memory in use (NVML)", labels=_LABELS)
        total = GaugeMetricFamily("hbmserve_gpu_memory_total_bytes", "GPU memory installed (NVML)", labels=_LABELS)
        nvlink = CounterMetricFamily("hbmserve_gpu_nvlink_bytes", "Data bytes over all NVLinks of the GPU since the "
                                     "driver loaded; rate() is the throughput", labels=(*_LABELS, "direction"))
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
