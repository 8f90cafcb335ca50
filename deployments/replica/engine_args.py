"""ModelSpec -> vLLM server arguments and environment. Pure: no vLLM import here.

The output is vLLM's own CLI vocabulary, so the same list works for
`python -m vllm.entrypoints.openai.api_server` (the bare baseline) and for the in-replica server.
The user's pass-through map (`engine_settings.vllm_args`) travels alongside as written: how a
value is spelt on the command line depends on the argument (vllm_argv.launch_argv turns the
whole launch into one argv with vLLM's own parser).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hbmserve.core.config import ModelSpec
from hbmserve.core.engine_settings import EngineKind

_QUANT_TO_VLLM = {"fp8": "fp8", "int8": "bitsandbytes", "int4": "bitsandbytes", "awq": "awq", "gptq": "gptq"}


@dataclass(frozen=True)
class EngineLaunch:
    cli_args: tuple[str, ...]  # hbmserve's own arguments, from the typed fields
    env: tuple[tuple[str, str], ...]
    vllm_args: tuple[tuple[str, Any], ...] = ()  # engine_settings.vllm_args, in file order


def _lora_args(model: ModelSpec) -> list[str]:
    """vLLM's LoRA arguments: LoRA on, and the slots. No adapter is registered at start: the
    replica registers each on demand within its slots (replica_middleware.py AdapterRegistry)."""
    slots = model.lora
    args = ["--enable-lora", "--max-loras", str(slots.max_loras), "--max-lora-rank", str(slots.max_lora_rank)]
    if slots.max_cpu_loras is not None:
        args += ["--max-cpu-loras", str(slots.max_cpu_loras)]
    return args


def publishes_kv_events(model: ModelSpec) -> bool:
    s = model.engine_settings
    return s.enable_prefix_caching and s.kv_events


def vllm_launch(model: ModelSpec, host: str, port: int, kv_events_config: dict[str, Any] | None = None) -> EngineLaunch:
    """`kv_events_config`: vLLM's --kv-events-config, for a model that `publishes_kv_events`
    (the replica's relay knows its sockets, deployments/kv/engine_relay.py)."""
    s = model.engine_settings
    args = [
        "--model", model.source,
        "--served-model-name", model.name,
        "--host", host,
        "--port", str(port),
        "--max-model-len", str(s.max_model_len),
        "--max-num-seqs", str(s.max_num_seqs),
        "--max-num-batched-tokens", str(s.max_num_batched_tokens),
        "--dtype", s.dtype,
        "--tensor-parallel-size", str(model.parallelism.tp),
        "--pipeline-parallel-size", str(model.parallelism.pp),
        "--enable-chunked-prefill" if s.enable_chunked_prefill else "--no-enable-chunked-prefill",
        "--enable-prefix-caching" if s.enable_prefix_caching else "--no-enable-prefix-caching",
        # Our replica logs its own access lines and metrics; vLLM's per-request log costs CPU.
        "--disable-uvicorn-access-log",
    ]
    if s.quantization is not None:
        args += ["--quantization", _QUANT_TO_VLLM[s.quantization]]
    if model.adapters:
        args += _lora_args(model)
    if kv_events_config is not None:
        # The doors hash prompts as the engine does (routing/engine_hashes.py): sha256_cbor, the
        # hash that is the same bytes in every process.
        args += ["--kv-events-config", json.dumps(kv_events_config), "--prefix-caching-hash-algo", "sha256_cbor"]
    env: dict[str, str] = {}
    if model.engine is EngineKind.VLLM_CPU:
        # vLLM's CPU platform takes its KV cache size from the environment, in GiB.
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, int(round(s.kv_offload_gib))))
        if model.parallelism.tp > 1:
            args += ["--distributed-executor-backend", "mp"]
    else:
        args += ["--gpu-memory-utilization", str(s.gpu_memory_utilization)]
        if s.kv_offload_gib > 0:
            args += ["--kv-offloading-size", str(s.kv_offload_gib)]
        if model.parallelism.tp * model.parallelism.pp > 1:
            args += ["--distributed-executor-backend", "ray"]
        if model.standbys_sleep:
            # Its standbys sleep (deployments/replica/standby_sleep.py): vLLM must be started able to.
            args += ["--enable-sleep-mode"]
    return EngineLaunch(cli_args=tuple(args), env=tuple(sorted(env.items())),
                        vllm_args=tuple(s.vllm_args.items()))
