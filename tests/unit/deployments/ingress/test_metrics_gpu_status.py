"""GPU gauges through NVML with the fake NVML of the placement tests (a DGX H100 shape), their
clean absence where NVML cannot be used; and the figures `hbmserve status` adds per model."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from hbmserve.cluster.status_figures import latency_vs_slo, status_roles, usd_per_hour
from hbmserve.core.records import DecisionRecord, Histogram, ReplicaInfo, ReplicaRoles
from hbmserve.core.scaling import ReplicaState, Tier
from hbmserve.deployments.ingress import door_metrics as gpu_metrics
from hbmserve.deployments.ingress.door_metrics import GpuCollector
from tests.unit.placement.io.test_placement_nvml_discovery import FakeNvml, _parsed as shape

GIB = 1024**3


class LiveNvml(FakeNvml):
    """The placement tests' fake, plus the live counters: GPU i is 10*i % busy, holds i GiB, and
    has sent 1000*(i+1) KiB over NVLink (received twice that); `no_nvlink` GPUs have no counters."""

    def __init__(self, *args, no_nvlink: frozenset[int] = frozenset(), **kw):
        super().__init__(*args, **kw)
        self.no_nvlink = no_nvlink

    def nvmlDeviceGetUtilizationRates(self, h): return SimpleNamespace(gpu=10 * h, memory=0)
    def nvmlDeviceGetMemoryInfo(self, h): return SimpleNamespace(total=80 * GIB, used=h * GIB, free=(80 - h) * GIB)

    def nvmlDeviceGetFieldValues(self, h, fields):
        if h in self.no_nvlink:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        assert [f for f, _ in fields] == [pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                                          pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX]
        kib = (1000 * (h + 1), 2000 * (h + 1))
        return [SimpleNamespace(nvmlReturn=pynvml.NVML_SUCCESS, value=SimpleNamespace(ullVal=v)) for v in kib]


def values(collector: GpuCollector) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in collector.collect() for s in f.samples}


def test_gpu_gauges_from_nvml_on_a_dgx_h100():
    nvml = LiveNvml(shape("dgx_h100"), switched=True, no_nvlink=frozenset({7}))
    collector = GpuCollector.open(nvml)
    assert collector is not None and nvml.initialised == 1
    got = values(collector)
    uuid = nvml.nvmlDeviceGetUUID(3)
    gpu3 = (("gpu", "3"), ("uuid", uuid))
    assert got[("hbmserve_gpu_utilization", gpu3)] == pytest.approx(0.3)
    assert got[("hbmserve_gpu_memory_used_bytes", gpu3)] == 3 * GIB
    assert got[("hbmserve_gpu_memory_total_bytes", gpu3)] == 80 * GIB
    assert got[("hbmserve_gpu_nvlink_bytes_total", (("direction", "tx"), *gpu3))] == 4000 * 1024
    assert got[("hbmserve_gpu_nvlink_bytes_total", (("direction", "rx"), *gpu3))] == 8000 * 1024
    assert len([k for k in got if k[0] == "hbmserve_gpu_utilization"]) == 8
    # GPU 7 reports no NVLink counters: no series for it, rather than a zero
    assert not [k for k in got if k[0] == "hbmserve_gpu_nvlink_bytes_total" and ("gpu", "7") in k[1]]
    collector.close()
    assert nvml.initialised == 0


def test_no_nvml_means_no_gpu_families_at_all(monkeypatch):
    class NoDriver:
        NVMLError = pynvml.NVMLError

        def nvmlInit(self):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    assert GpuCollector.open(NoDriver()) is None

    def missing():
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(gpu_metrics, "load_pynvml", missing)
    assert GpuCollector.open() is None


# ---- hbmserve status figures ----

def info(replica: str, role=ReplicaState.ACTIVE, ttft=None, tpot=None, usd=2.0) -> ReplicaInfo:
    return ReplicaInfo(model="m", engine="sim", url="http://x", role=role, replica=replica, node_id="n", pid=1,
                       in_flight=0, engine_waiting=0, engine_running=0, kv_usage=0.0, accepted=0, rejected=0,
                       healthy=True, ttft_histogram=ttft, tpot_histogram=tpot, slo_ttft_p95_s=0.5,
                       slo_tpot_p95_s=0.05, usd_per_hour=usd)


def test_status_p95_merges_the_replicas_histograms_against_the_slo():
    # Replica a: 10 TTFTs, all <= 0.1 s; replica b: 10, all in (0.1, 1.0]. Together rank 19 of
    # 20 lies in (0.1, 1.0], which holds ranks 10..20: 0.1 + 0.9 * (19 - 10) / 10 = 0.91 s.
    a = Histogram(bounds=(0.1, 1.0), cumulative=(10, 10), count=10)
    b = Histogram(bounds=(0.1, 1.0), cumulative=(0, 10), count=10)
    fast = Histogram(bounds=(0.01, 0.1), cumulative=(20, 20), count=20)
    lat = latency_vs_slo([info("a", ttft=a, tpot=fast), info("b", ttft=b), info("old", usd=None)])
    assert lat.ttft_p95_s == pytest.approx(0.91) and lat.requests == 20
    assert lat.tpot_p95_s == pytest.approx(0.0095)  # rank 19 of 20 in (0, 0.01]
    assert (lat.ttft_ok, lat.tpot_ok) == (False, True)
    assert latency_vs_slo([info("old")]) is None  # no replica reported histograms


def test_status_roles_and_price():
    decision = DecisionRecord(at=0.0, target_active=1, target_standby={Tier.HOT: 1, Tier.WARM: 2},
                              active_replicas=("a",), standby_replicas=("b",), reason="hold", serve_target=2)
    roles = status_roles({"RUNNING": 3, "STARTING": 1, "STOPPING": 1},
                         [ReplicaState.ACTIVE, ReplicaState.STANDBY], decision)
    # three running, one of them standby; the third did not answer and counts as active
    assert roles == ReplicaRoles(starting=1, active=2, standby=1, draining=1, warm=2)
    assert status_roles({}, [], None) == ReplicaRoles()
    assert usd_per_hour([info("a"), info("b", usd=3.5), info("c", usd=None)]) == 5.5
    assert usd_per_hour([info("c", usd=None)]) is None
