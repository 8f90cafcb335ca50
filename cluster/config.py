"""The cluster config file (`ClusterSpec`), validated with pydantic at the edge.

A user error here must read like an error message, not a traceback: `load_cluster_spec`
raises `ConfigError` whose text names each bad field by its dotted path and says what is allowed.
"""

from __future__ import annotations

import os
from enum import Enum
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

DEFAULT_CONFIG_NAME = "default_cluster.yaml"


class ConfigError(ValueError):
    """A config file that cannot be used; the message is meant for the user as-is."""


class _Strict(BaseModel):
    # Unknown keys are typos far more often than forward-compatible extensions.
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineKind(str, Enum):
    VLLM_GPU = "vllm-gpu"
    VLLM_CPU = "vllm-cpu"
    SIM = "sim"


class PreemptionMode(str, Enum):
    RECOMPUTE = "recompute"
    SWAP = "swap"


class EngineSettings(_Strict):
    max_model_len: Annotated[int, Field(gt=0)] = 512
    max_num_seqs: Annotated[int, Field(gt=0)] = 64
    max_num_batched_tokens: Annotated[int, Field(gt=0)] = 2048
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    quantization: Literal["fp8", "int8", "int4", "awq", "gptq"] | None = None
    # vLLM V1 always preempts by recompute; swap is only modelled by the simulator.
    preemption_mode: PreemptionMode = PreemptionMode.RECOMPUTE
    # Host RAM for KV offload (vLLM's CPU KV space on the CPU platform, swap space on GPUs).
    kv_offload_gib: Annotated[float, Field(ge=0)] = 1.0

    @model_validator(mode="after")
    def _batch_fits_one_sequence(self) -> EngineSettings:
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                "max_num_batched_tokens must be >= max_model_len when enable_chunked_prefill is "
                f"false ({self.max_num_batched_tokens} < {self.max_model_len})"
            )
        return self


class Parallelism(_Strict):
    tp: Annotated[int, Field(ge=1, le=64)] = 1
    pp: Annotated[int, Field(ge=1, le=64)] = 1


class AutoscalingSpec(_Strict):
    min_replicas: Annotated[int, Field(ge=0)] = 1
    max_replicas: Annotated[int, Field(ge=1)] = 1
    target_queue_per_replica: Annotated[float, Field(gt=0)] = 4.0

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) must be <= max_replicas ({self.max_replicas})"
            )
        return self


class SLO(_Strict):
    ttft_p95_ms: Annotated[float, Field(gt=0)] = 2000.0
    tpot_p95_ms: Annotated[float, Field(gt=0)] = 100.0


class Hardware(_Strict):
    gpu: str = "cpu-local"
    # None means the catalog's default price for `gpu`.
    usd_per_gpu_hour: Annotated[float, Field(ge=0)] | None = None


class SimEngineSpec(_Strict):
    """What the simulated engine pretends to be (used when `engine: sim`)."""

    gpu: str = "h100-sxm"
    model_config_name: str = "llama-3.1-8b"
    speedup: Annotated[float, Field(gt=0)] = 1.0
    startup_s: Annotated[float, Field(ge=0)] = 0.0


class ModelSpec(_Strict):
    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9._:/-]+$")]
    # A local directory, or a hub id (GPU clusters only: this project never downloads in tests).
    source: Annotated[str, Field(min_length=1)]
    engine: EngineKind = EngineKind.VLLM_CPU
    engine_settings: EngineSettings = EngineSettings()
    parallelism: Parallelism = Parallelism()
    replicas: Annotated[int, Field(ge=0)] = 1
    autoscaling: AutoscalingSpec | None = None
    slo: SLO = SLO()
    hardware: Hardware = Hardware()
    sim: SimEngineSpec = SimEngineSpec()

    @model_validator(mode="after")
    def _cpu_has_no_model_parallelism(self) -> ModelSpec:
        if self.engine is EngineKind.VLLM_CPU and self.parallelism.pp > 1:
            raise ValueError("parallelism.pp > 1 needs engine vllm-gpu (vLLM's CPU platform has no Ray executor)")
        return self


class HttpSpec(_Strict):
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 8000


class ServeSpec(_Strict):
    http: HttpSpec = HttpSpec()
    # Names of environment variables holding accepted API keys; empty means no auth.
    api_key_env: str | None = None
    # Ray dashboard port for `hbmserve up`.
    dashboard_port: Annotated[int, Field(ge=1, le=65535)] = 8265


class ClusterSpec(_Strict):
    name: Annotated[str, Field(min_length=1)] = "hbmserve"
    serve: ServeSpec = ServeSpec()
    models: Annotated[list[ModelSpec], Field(min_length=1)]

    @model_validator(mode="after")
    def _unique_names(self) -> ClusterSpec:
        names = [m.name for m in self.models]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"model names must be unique; repeated: {', '.join(dupes)}")
        return self

    def model(self, name: str) -> ModelSpec | None:
        return next((m for m in self.models if m.name == name), None)


def _format_errors(source: str, err: ValidationError) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        lines.append(f"  {path}: {msg}")
    return "\n".join(lines)


def parse_cluster_spec(data: object, source: str = "<data>") -> ClusterSpec:
    if not isinstance(data, dict):
        raise ConfigError(f"invalid config {source}: the top level must be a mapping with a 'models' list")
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(source, err)) from None


def load_cluster_spec(path: str | os.PathLike[str] | None = None) -> ClusterSpec:
    """Load a YAML config; None loads the embedded default (the tiny model on vLLM-CPU).

    Relative `source` paths are resolved against the config file's folder, so a config keeps
    working when run from elsewhere (for instance by `ray job submit`).
    """
    if path is None:
        text = resources.files("hbmserve.cluster").joinpath(DEFAULT_CONFIG_NAME).read_text()
        base = Path.cwd()
        source = f"(embedded {DEFAULT_CONFIG_NAME})"
    else:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        text, base, source = p.read_text(), p.resolve().parent, str(p)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"invalid config {source}: not valid YAML ({err})") from None
    spec = parse_cluster_spec(data, source)
    return _resolve_sources(spec, base)


def _resolve_sources(spec: ClusterSpec, base: Path) -> ClusterSpec:
    models = []
    for m in spec.models:
        src = Path(os.path.expanduser(m.source))
        if m.source.startswith((".", "/", "~")):
            m = m.model_copy(update={"source": str(src if src.is_absolute() else (base / src).resolve())})
        models.append(m)
    return spec.model_copy(update={"models": models})
