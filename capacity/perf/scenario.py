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

from hbmserve.capacity.perf.engine_core import EngineConfig
from hbmserve.capacity.perf.hardware import GpuProfile, get_gpu, load_catalog
from hbmserve.capacity.perf.lora import LoraCost, lora_cost
from hbmserve.capacity.perf.model_shape import ModelShape, load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment, cost_model, memory_fit
from hbmserve.capacity.perf.plan_analytic import EngineKnobs, Workload
from hbmserve.capacity.perf.slo_cap import LIGHT_RPS, SloCheck, slo_check

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
            swap_space_tokens=int(es.kv_offload_gib * GIB / per_tok), host_kv_tokens=host_kv_tokens(m, per_tok),
            lora=lora_of(m, dep))
    except ValueError as err:
        raise ScenarioError(f"models.{m.name}.engine_settings: {err}") from None
    return Scenario(dep, engine, m.replicas, gpu.usd_per_gpu_hour, m.slo.ttft_p95_ms / 1e3, m.slo.tpot_p95_ms / 1e3)


def lora_of(m: ModelSpec, dep: Deployment) -> LoraCost | None:
    """The LoRA slots and costs of a model that declares adapters (capacity/perf/lora.py), at the
    largest rank its slots take; None without adapters."""
    if not m.adapters:
        return None
    return lora_cost(dep, m.lora.max_loras, m.lora.max_cpu_loras, m.lora.max_lora_rank)


def host_kv_tokens(m: ModelSpec, kv_bytes_per_token: float) -> int:
    """The host-memory KV tier the engine runs with, in tokens: on a GPU engine with prefix
    caching, `kv_offload_gib` is vLLM's --kv-offloading-size (deployments/replica/engine_args.py),
    a prefix-cache tier in host memory; the simulated engine stands for such a GPU engine. On
    vLLM-CPU the same setting is the KV cache itself, so there is no tier behind it."""
    es = m.engine_settings
    if not es.enable_prefix_caching or m.engine is EngineKind.VLLM_CPU:
        return 0
    return int(es.kv_offload_gib * GIB / kv_bytes_per_token)


def knobs_of(sc: Scenario) -> EngineKnobs:
    e = sc.engine
    return EngineKnobs(e.max_num_seqs, e.max_num_batched_tokens, e.enable_chunked_prefill,
                       e.num_blocks * e.block_size)


def tpot_floor_s(sc: Scenario) -> float:
    """The lowest TPOT a replica of `sc` reaches at any load: one sequence decoding alone, at half
    the context window (traffic is unknown where the policy's config is built; the context moves
    a decode step little next to the weights it reads). The policy does not chase a TPOT target
    below it with replicas (autoscale/stages.py `needs_of`)."""
    return float(cost_model(sc.deployment).step_time(1, sc.engine.max_model_len / 2))


def scenario_slo_check(sc: Scenario, w: Workload, lightest_rps: float = LIGHT_RPS) -> SloCheck:
    """`slo_check` for a config entry: can its engine settings meet its SLO on `w` at some
    replica count (per-replica load down to `lightest_rps`)?"""
    return slo_check(cost_model(sc.deployment), knobs_of(sc), w, sc.slo_ttft_s, sc.slo_tpot_s, lightest_rps)


NOMINAL_PROMPT_TOKENS = 2048
NOMINAL_OUTPUT_TOKENS = 128


def nominal_workload(sc: Scenario) -> Workload:
    """What a check with no traffic to go by judges: a 2,048-token prompt (or half the context
    window, if shorter) and 128 output tokens."""
    mml = sc.engine.max_model_len
    prompt = float(min(NOMINAL_PROMPT_TOKENS, max(1, mml // 2)))
    out = float(min(NOMINAL_OUTPUT_TOKENS, max(1, mml - int(prompt))))
    return Workload(rate_rps=LIGHT_RPS, peak_rps=LIGHT_RPS, prompt_mean=prompt, output_mean=out,
                    prompt_p95=prompt, max_len=int(prompt + out))


def replica_usd_per_hour(model: ModelSpec) -> float | None:
    """What one replica of `model` costs an hour: its tp x pp GPUs at `hardware.usd_per_gpu_hour`
    or the catalog's price (`engine: sim`: the GPU it pretends to be); None when the catalog
    does not know the GPU."""
    catalog = load_catalog()
    try:
        name = resolve_gpu_name(model.sim.gpu if model.engine is EngineKind.SIM else model.hardware.gpu, catalog)
        price = get_gpu(name, catalog, model.hardware.usd_per_gpu_hour).usd_per_gpu_hour
    except ValueError:  # ScenarioError, CatalogError: an unknown GPU has no price
        return None
    return price * model.parallelism.tp * model.parallelism.pp
