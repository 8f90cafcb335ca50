"""The hardware catalog: accelerator profiles (HBM, bandwidth, FLOP/s, links, price) as data.

The numbers live in `data/hardware.yaml` (with their sources); this module validates that file
with pydantic at the edge and hands out frozen `GpuProfile`s. Prices and efficiency factors are
always overridable (`with_price`, `with_efficiency`, `with_overheads`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

CATALOG_FILE = "hardware.yaml"
GB = 1e9


class CatalogError(ValueError):
    """A catalog file or a GPU name that cannot be used; the message is for the user as-is."""


@dataclass(frozen=True)
class Link:
    kind: str
    bw_bytes_s: float  # per direction, DMA / point-to-point
    collective_bw_bytes_s: float  # per direction, as seen by a ring all-reduce
    latency_s: float


@dataclass(frozen=True)
class Efficiency:
    """Achievable fraction of the datasheet peak (the roofline's two knobs)."""

    flops: float
    hbm_bw: float


@dataclass(frozen=True)
class Overheads:
    """Time that is not FLOPs or bytes: scheduling, sampling, launch, API front end."""

    step_s: float  # per engine step
    per_seq_s: float  # per sequence in a step (sampling, detokenising)
    request_s: float  # per request, before it reaches the engine queue (HTTP, tokenising)


@dataclass(frozen=True)
class GpuProfile:
    name: str
    description: str
    hbm_bytes: float
    hbm_bw_bytes_s: float
    bf16_flops: float
    fp8_flops: float | None
    int8_ops: float | None
    gpus_per_node: int
    intra_node: Link
    inter_node: Link
    host_link: Link
    efficiency: Efficiency
    overheads: Overheads
    reserve_bytes: float
    usd_per_gpu_hour: float
    # A fixed KV pool (vLLM-CPU's VLLM_CPU_KVCACHE_SPACE) instead of HBM * utilisation.
    kv_cache_bytes: float | None = None

    def flops_for(self, quantization: str | None) -> float:
        """Peak dense FLOP/s the matmuls run at for a weight format (weight-only falls back to BF16)."""
        if quantization == "fp8" and self.fp8_flops is not None:
            return self.fp8_flops
        if quantization == "int8" and self.int8_ops is not None:
            return self.int8_ops
        return self.bf16_flops

    def with_price(self, usd_per_gpu_hour: float | None) -> GpuProfile:
        return self if usd_per_gpu_hour is None else replace(self, usd_per_gpu_hour=usd_per_gpu_hour)

    def with_efficiency(self, flops: float | None = None, hbm_bw: float | None = None) -> GpuProfile:
        eff = Efficiency(
            flops=self.efficiency.flops if flops is None else flops,
            hbm_bw=self.efficiency.hbm_bw if hbm_bw is None else hbm_bw,
        )
        return replace(self, efficiency=eff)

    def with_overheads(self, step_s: float | None = None, per_seq_s: float | None = None,
                       request_s: float | None = None) -> GpuProfile:
        o = self.overheads
        return replace(self, overheads=Overheads(
            step_s=o.step_s if step_s is None else step_s,
            per_seq_s=o.per_seq_s if per_seq_s is None else per_seq_s,
            request_s=o.request_s if request_s is None else request_s,
        ))


# ---- file schema (edge) -------------------------------------------------------------------------

PositiveFloat = Annotated[float, Field(gt=0)]
NonNeg = Annotated[float, Field(ge=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _LinkFile(_Strict):
    kind: str
    bw_gbps: PositiveFloat
    collective_bw_gbps: PositiveFloat
    latency_us: NonNeg


class _EfficiencyFile(_Strict):
    flops: Annotated[float, Field(gt=0, le=1)]
    hbm_bw: Annotated[float, Field(gt=0, le=1)]


class _OverheadsFile(_Strict):
    step_s: NonNeg
    per_seq_s: NonNeg
    request_s: NonNeg


class _GpuFile(_Strict):
    description: str
    hbm_gb: PositiveFloat
    hbm_bw_gbps: PositiveFloat
    bf16_tflops: PositiveFloat
    fp8_tflops: PositiveFloat | None = None
    int8_tops: PositiveFloat | None = None
    gpus_per_node: Annotated[int, Field(ge=1)]
    intra_node: _LinkFile
    inter_node: _LinkFile
    host_link: _LinkFile
    efficiency: _EfficiencyFile
    overheads: _OverheadsFile
    reserve_gb: NonNeg
    kv_cache_gb: PositiveFloat | None = None
    usd_per_gpu_hour: NonNeg


class _CatalogFile(_Strict):
    gpus: dict[str, _GpuFile]


def _link(f: _LinkFile) -> Link:
    return Link(kind=f.kind, bw_bytes_s=f.bw_gbps * GB, collective_bw_bytes_s=f.collective_bw_gbps * GB,
                latency_s=f.latency_us * 1e-6)


def _profile(name: str, f: _GpuFile) -> GpuProfile:
    return GpuProfile(
        name=name,
        description=f.description,
        hbm_bytes=f.hbm_gb * GB,
        hbm_bw_bytes_s=f.hbm_bw_gbps * GB,
        bf16_flops=f.bf16_tflops * 1e12,
        fp8_flops=None if f.fp8_tflops is None else f.fp8_tflops * 1e12,
        int8_ops=None if f.int8_tops is None else f.int8_tops * 1e12,
        gpus_per_node=f.gpus_per_node,
        intra_node=_link(f.intra_node),
        inter_node=_link(f.inter_node),
        host_link=_link(f.host_link),
        efficiency=Efficiency(flops=f.efficiency.flops, hbm_bw=f.efficiency.hbm_bw),
        overheads=Overheads(step_s=f.overheads.step_s, per_seq_s=f.overheads.per_seq_s,
                            request_s=f.overheads.request_s),
        reserve_bytes=f.reserve_gb * GB,
        usd_per_gpu_hour=f.usd_per_gpu_hour,
        kv_cache_bytes=None if f.kv_cache_gb is None else f.kv_cache_gb * GB,
    )


def parse_catalog(data: object, source: str = "<data>") -> dict[str, GpuProfile]:
    try:
        parsed = _CatalogFile.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        path = ".".join(str(p) for p in first["loc"])
        raise CatalogError(f"invalid hardware catalog {source}: {path}: {first['msg']}") from None
    return {name: _profile(name, g) for name, g in parsed.gpus.items()}


def load_catalog(path: str | os.PathLike[str] | None = None) -> dict[str, GpuProfile]:
    """The shipped catalog, or a user's YAML file of the same shape."""
    if path is None:
        text = resources.files("hbmserve.capacity.perf").joinpath("data", CATALOG_FILE).read_text()
        source = f"(embedded {CATALOG_FILE})"
    else:
        p = Path(path)
        if not p.is_file():
            raise CatalogError(f"hardware catalog not found: {p}")
        text, source = p.read_text(), str(p)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise CatalogError(f"invalid hardware catalog {source}: not valid YAML ({err})") from None
    return parse_catalog(data, source)


def get_gpu(name: str, catalog: dict[str, GpuProfile] | None = None,
            usd_per_gpu_hour: float | None = None) -> GpuProfile:
    cat = load_catalog() if catalog is None else catalog
    key = name.strip().lower()
    if key not in cat:
        raise CatalogError(f"unknown gpu {name!r}; known: {', '.join(sorted(cat))}")
    return cat[key].with_price(usd_per_gpu_hour)
