"""From a cluster config (`core/config.py`'s ModelSpec) to what the simulator runs.

Which GPU and model shape a config entry stands for:
  - `engine: sim` pretends to be `sim.gpu` running `sim.model_config_name`;
  - otherwise the GPU is `hardware.gpu`, and the shape is the `config.json` in the model's
    `source` folder when there is one, else `sim.model_config_name` (a shipped shape).
`hardware.usd_per_gpu_hour` overrides the catalog price; `engine_settings`, `parallelism` and
`replicas` apply as written.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from hbmserve.core.config import ModelSpec
from hbmserve.core.engine_settings import EngineKind

from hbmserve.capacity.engine_core import EngineConfig
from hbmserve.capacity.hardware import GpuProfile, get_gpu
from hbmserve.capacity.model_shape import ModelShape, load_model_shape
from hbmserve.capacity.perf_model import Deployment, memory_fit

BLOCK_SIZE = 16
GIB = 1024**3


class ScenarioError(ValueError):
    """A config entry that cannot be simulated; the message names the field."""


@dataclass(frozen=True)
class Scenario:
    deployment: Deployment
    engine: EngineConfig
    replicas: int
    usd_per_gpu_hour: float
    slo_ttft_s: float
    slo_tpot_s: float


def resolve_gpu_name(name: str, catalog: dict[str, GpuProfile]) -> str:
    """Exact catalog name, or a unique prefix of one (`h100` -> `h100-sxm`)."""
    key = name.strip().lower()
    if key in catalog:
        return key
    hits = [n for n in catalog if n.startswith(key)]
    if len(hits) == 1:
        return hits[0]
    known = ", ".join(sorted(catalog))
    raise ScenarioError(f"unknown gpu {name!r}" + (f" (ambiguous: {', '.join(hits)})" if hits else "")
                        + f"; known: {known}")


def shape_for(m: ModelSpec, override: str | None = None) -> ModelShape:
    if override:
        shape = load_model_shape(override)
    elif m.engine is EngineKind.SIM:
        shape = load_model_shape(m.sim.model_config_name)
    else:
        src = Path(m.source).expanduser()
        cfg = src / "config.json"
        shape = load_model_shape(cfg) if cfg.is_file() else load_model_shape(m.sim.model_config_name)
    dtype = m.engine_settings.dtype
    if dtype == "float32":
        shape = replace(shape, dtype_bytes=4.0)
    elif dtype in ("bfloat16", "float16"):
        shape = replace(shape, dtype_bytes=2.0)
    return shape


def scenario_for(m: ModelSpec, catalog: dict[str, GpuProfile], gpu_override: str | None = None,
                 shape_override: str | None = None, max_model_len: int | None = None) -> Scenario:
    gpu_name = gpu_override or (m.sim.gpu if m.engine is EngineKind.SIM else m.hardware.gpu)
    gpu = get_gpu(resolve_gpu_name(gpu_name, catalog), catalog, m.hardware.usd_per_gpu_hour)
    shape = shape_for(m, shape_override)
    es = m.engine_settings
    dep = Deployment(shape, gpu, m.parallelism.tp, m.parallelism.pp, es.quantization, es.gpu_memory_utilization)
    fit = memory_fit(dep)
    if not fit.fits:
        raise ScenarioError(f"models.{m.name}: {fit.reason}")
    mml = max_model_len or es.max_model_len
    per_tok = shape.kv_bytes_per_token_per_rank(dep.tp, dep.pp)
    try:
        engine = EngineConfig(
            num_blocks=fit.kv_tokens // BLOCK_SIZE, block_size=BLOCK_SIZE, max_num_seqs=es.max_num_seqs,
            max_num_batched_tokens=max(es.max_num_batched_tokens, 1 if es.enable_chunked_prefill else mml),
            max_model_len=mml, enable_chunked_prefill=es.enable_chunked_prefill,
            enable_prefix_caching=es.enable_prefix_caching, preemption_mode=es.preemption_mode.value,
            swap_space_tokens=int(es.kv_offload_gib * GIB / per_tok))
    except ValueError as err:
        raise ScenarioError(f"models.{m.name}.engine_settings: {err}") from None
    return Scenario(dep, engine, m.replicas, gpu.usd_per_gpu_hour, m.slo.ttft_p95_ms / 1e3, m.slo.tpot_p95_ms / 1e3)
