"""LoRA adapters of a model as the config declares them (issue 25): each is served under its own
name on the base model's replicas, and each replica holds a bounded number at once.

A model's `adapters` name each fine-tune and where its weights are (resolved through the node's
weight cache like a base model's `source`: a local folder, a hub id, HTTP or S3); `lora` sets
vLLM's slots: `max_loras` adapters in one batch (on the GPU), `max_lora_rank` the largest rank
a slot takes, `max_cpu_loras` adapters kept in host memory to swap in.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from hbmserve.core.engine_settings import Strict

# vLLM's LoRAConfig.max_lora_rank takes only these (vllm/config/lora.py MaxLoRARanks).
LoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
# vLLM's own argument names for what `adapters` and `lora` set: a model that declares adapters
# may not also set them in engine_settings.vllm_args (two sources for one setting).
LORA_VLLM_ARGS = {"enable_lora": "adapters", "lora_modules": "adapters", "max_loras": "lora.max_loras",
                  "max_lora_rank": "lora.max_lora_rank", "max_cpu_loras": "lora.max_cpu_loras"}


class AdapterSpec(Strict):
    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9._:/-]+$")]
    source: Annotated[str, Field(min_length=1)]
    # Its rank, where known: checked against lora.max_lora_rank before any replica starts.
    max_rank: Annotated[int, Field(ge=1)] | None = None
    # The tenants (serve.auth's keys file) that may call it; None: every tenant.
    tenants: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] | None = None
    # Its own limits, all tenants together (each tenant's own limits apply too); None: none.
    requests_per_minute: Annotated[int, Field(ge=1)] | None = None
    tokens_per_minute: Annotated[int, Field(ge=1)] | None = None


class LoraSlots(Strict):
    max_loras: Annotated[int, Field(ge=1)] = 4
    max_lora_rank: LoraRank = 16
    max_cpu_loras: Annotated[int, Field(ge=1)] | None = None  # None: vLLM's default (max_loras)

    @model_validator(mode="after")
    def _cpu_holds_the_gpu_slots(self) -> LoraSlots:
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras}): "
                             "the host keeps every adapter a batch may use")
        return self


def adapter_problems(adapters: list[AdapterSpec], slots: LoraSlots, vllm_args: dict) -> list[str]:
    """What is wrong with one model's adapters, each naming its field (empty: nothing)."""
    problems = []
    if adapters:
        both = [f"engine_settings.vllm_args.{k}: set by {LORA_VLLM_ARGS[k]} when the model declares adapters; "
                "remove it" for k in vllm_args if k in LORA_VLLM_ARGS]
        problems += both
    names = [a.name for a in adapters]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        problems.append(f"adapters: names must be unique; repeated: {', '.join(dupes)}")
    for i, a in enumerate(adapters):
        if a.max_rank is not None and a.max_rank > slots.max_lora_rank:
            problems.append(f"adapters.{i}.max_rank: {a.name} has rank {a.max_rank}, above lora.max_lora_rank "
                            f"({slots.max_lora_rank}); raise it to one of 8, 16, 32, 64, 128, 256, 320, 512")
    return problems
