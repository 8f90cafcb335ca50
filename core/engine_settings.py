"""The engine part of a model's config: which engine, and the settings it runs with (vLLM's
typed arguments plus a checked pass-through of the rest). Split from core/config.py.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator
from pydantic_core import PydanticCustomError


class Strict(BaseModel):
    # Unknown keys are typos far more often than forward-compatible extensions.
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineKind(str, Enum):
    VLLM_GPU = "vllm-gpu"
    VLLM_CPU = "vllm-cpu"
    SIM = "sim"


class PreemptionMode(str, Enum):
    RECOMPUTE = "recompute"
    SWAP = "swap"


# vLLM arguments that `engine_settings.vllm_args` may not set, and where the setting lives.
# Typed fields are read by the planner and the simulator: a second copy in the map would let
# the plan and the engine disagree. The rest hbmserve sets itself (the replica's name, port and
# listener, its scaling), or vLLM's own HTTP server reads them and hbmserve does not run it.
_VLLM_ARGS_TYPED_ELSEWHERE = {
    "kv_offloading_size": "engine_settings.kv_offload_gib",
    # The doors follow the events and hash prompts as the engine does: sha256_cbor, set with them.
    "kv_events_config": "engine_settings.kv_events",
    "prefix_caching_hash_algo": "engine_settings.kv_events",
    "tensor_parallel_size": "parallelism.tp",
    "pipeline_parallel_size": "parallelism.pp",
    "model": "the model's `source`",
    "served_model_name": "the model's `name`",
    "host": "serve.http.host",
    "port": "serve.http.port",
    "api_key": "serve.auth.keys_file",
}
_NOT_RUN_SERVER = ("only vLLM's own HTTP server reads it, and hbmserve does not run that server "
                   "(each replica serves vLLM's app on hbmserve's listener)")
_ONE_ENGINE_PER_REPLICA = "hbmserve runs one engine per replica; scale with `replicas` or `autoscaling`"
_VLLM_ARGS_OWNED = {
    "distributed_executor_backend": "hbmserve chooses it from engine and parallelism (mp on vllm-cpu, ray on vllm-gpu)",
    "disable_log_stats": "hbmserve needs vLLM's engine statistics (admission, autoscaling and `hbmserve status` read them)",
    "config": "hbmserve passes the whole argument list and a second file would override it; list them in vllm_args",
    **dict.fromkeys(("headless", "grpc", "grpc_port", "api_server_count", "uds", "uvicorn_log_level",
                     "disable_uvicorn_access_log", "disable_access_log_for_endpoints",
                     "enable_ssl_refresh"), _NOT_RUN_SERVER),
}
_VLLM_ARGS_OWNED_PREFIXES = {
    "data_parallel_": _ONE_ENGINE_PER_REPLICA,
    "dp_supervisor_": _ONE_ENGINE_PER_REPLICA,
    "ssl_": _NOT_RUN_SERVER,
    "h11_": _NOT_RUN_SERVER,
}


def vllm_arg_refusal(name: str) -> str | None:
    """Why the vLLM argument `name` (underscore form) may not go in `vllm_args`, or None if it may.

    Shared by the schema (by name) and the deploy check (by the argument's destination, which
    also catches vLLM's aliases)."""
    if name in EngineSettings.model_fields and name != "vllm_args":
        return f"it is a typed field: set engine_settings.{name} instead"
    if name in _VLLM_ARGS_TYPED_ELSEWHERE:
        return f"hbmserve sets it from {_VLLM_ARGS_TYPED_ELSEWHERE[name]}; set that instead"
    return _VLLM_ARGS_OWNED.get(name) or next(
        (why for prefix, why in _VLLM_ARGS_OWNED_PREFIXES.items() if name.startswith(prefix)), None)


def _vllm_arg_name(key: str) -> str:
    """A `vllm_args` key: vLLM's argument name in dash or underscore form, kept in underscore form."""
    name = key.replace("-", "_")
    if key.startswith("-"):
        why = f"write the argument name without leading dashes ({name.lstrip('_')}, not {key})"
    elif not (name[:1].isalpha() and all(c.isalnum() or c == "_" for c in name)):
        why = ("not a vLLM argument name (letters, digits, - and _; a nested setting is a mapping: "
               "compilation_config: {mode: 3}, not compilation_config.mode: 3)")
    elif (refusal := vllm_arg_refusal(name)) is not None:
        why = f"not allowed in vllm_args: {refusal}"
    else:
        why = None
    if why:
        raise PydanticCustomError("vllm_arg", "{why}", {"why": why})
    return name


class EngineSettings(Strict):
    """What the engine runs with. The typed fields are what the planner and the simulator read;
    `vllm_args` passes any other vLLM engine or server argument through to the replicas' vLLM
    (checked by vLLM's own parser at deploy: hbmserve.deployments.replica.vllm_argv)."""

    max_model_len: Annotated[int, Field(gt=0)] = 512
    max_num_seqs: Annotated[int, Field(gt=0)] = 64
    max_num_batched_tokens: Annotated[int, Field(gt=0)] = 2048
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False
    # With prefix caching on, the engine publishes its KV events and the front doors route each
    # request to the replica that holds most of its prompt (deployments/kv). False: the doors
    # route on what they sent each replica, blind to evictions and to other doors' traffic.
    kv_events: bool = True
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    quantization: Literal["fp8", "int8", "int4", "awq", "gptq"] | None = None
    # vLLM V1 always preempts by recompute; swap is only modelled by the simulator.
    preemption_mode: PreemptionMode = PreemptionMode.RECOMPUTE
    # Host RAM for KV offload (vLLM's CPU KV space on the CPU platform, swap space on GPUs).
    kv_offload_gib: Annotated[float, Field(ge=0)] = 1.0
    # vLLM's CLI argument name (dash or underscore form, stored with underscores) -> value:
    # true/false for a flag, a list for a multi-value argument, a mapping for a JSON one, null
    # for vLLM's default. E.g. {enable_lora: true, tool_call_parser: hermes}.
    vllm_args: dict[Annotated[str, AfterValidator(_vllm_arg_name)], JsonValue] = Field(default_factory=dict)

    @field_validator("vllm_args", mode="before")
    @classmethod
    def _one_spelling_per_argument(cls, value: Any) -> Any:
        # Both spellings would collapse into one key, silently keeping whichever came last.
        if isinstance(value, dict):
            seen: dict[str, str] = {}
            for key in value:
                other = seen.setdefault(str(key).replace("-", "_"), str(key))
                if other != key:
                    raise PydanticCustomError("vllm_arg", "{a} and {b} are the same vLLM argument; keep one",
                                              {"a": other, "b": key})
        return value

    @model_validator(mode="after")
    def _batch_fits_one_sequence(self) -> EngineSettings:
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                "max_num_batched_tokens must be >= max_model_len when enable_chunked_prefill is "
                f"false ({self.max_num_batched_tokens} < {self.max_model_len})"
            )
        return self
