"""A model's shape, read from a Hugging Face `config.json` (offline), and what it costs in bytes.

Counts parameters of Llama-, Qwen2- and Mixtral-style decoders (gated-SiLU MLP, GQA attention,
optional q/k/v bias, optional mixture-of-experts). Quantisation applies to the linear layers of
the decoder blocks; embeddings, the LM head and norms stay in the activation dtype, as vLLM's
FP8/INT8/INT4 checkpoints keep them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# Bytes per parameter for each weight format the planner searches.
WEIGHT_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
# INT4 (GPTQ/AWQ) stores one fp16 scale per group of 128 weights.
INT4_GROUP_SIZE = 128
# Names vLLM accepts for `quantization`, mapped to the weight format they imply.
QUANT_ALIASES: dict[str, str] = {"fp8": "fp8", "int8": "int8", "int4": "int4", "awq": "int4", "gptq": "int4"}
# What a weight format costs in answer quality. bf16 is the reference; fp8 (E4M3 weights and
# activations with per-channel scales) scores within evaluation noise of it in vLLM's and
# NVIDIA's published results, so the planner offers both by default. The formats named here
# have a known loss and are searched only when asked for (`hbmserve plan --quantization`).
QUALITY_TRADEOFFS: dict[str, str] = {
    "int8": "int8 (W8A8) trades a small accuracy loss, task-dependent, for half the weight bytes; "
            "check it on your own evaluations",
    "int4": "int4 weights (AWQ/GPTQ) lose measurable accuracy, most on reasoning, code and long "
            "contexts; check it on your own evaluations before buying",
}
NO_KNOWN_LOSS: tuple[str, ...] = ("bf16", "fp8")


class ModelConfigError(ValueError):
    """A config.json (or shipped model name) that cannot be used; the message is for the user."""


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_layers: int
    hidden: int
    intermediate: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab: int
    tie_embeddings: bool = False
    qkv_bias: bool = False
    num_experts: int = 1  # 1 = dense MLP
    experts_per_token: int = 1
    max_position_embeddings: int = 4096
    dtype_bytes: float = 2.0  # activation / KV dtype (bf16 unless the checkpoint says float32)

    # ---- parameter counts ----
    @property
    def attention_params_per_layer(self) -> int:
        q = self.hidden * self.num_heads * self.head_dim
        kv = 2 * self.hidden * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * self.hidden
        bias = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim if self.qkv_bias else 0
        return q + kv + o + bias

    @property
    def expert_params(self) -> int:
        """One gated-SiLU MLP: gate, up and down projections."""
        return 3 * self.hidden * self.intermediate

    @property
    def router_params_per_layer(self) -> int:
        return self.hidden * self.num_experts if self.num_experts > 1 else 0

    @property
    def linear_params_per_layer(self) -> int:
        return self.attention_params_per_layer + self.num_experts * self.expert_params + self.router_params_per_layer

    @property
    def active_linear_params_per_layer(self) -> int:
        k = min(self.experts_per_token, self.num_experts)
        return self.attention_params_per_layer + k * self.expert_params + self.router_params_per_layer

    @property
    def embedding_params(self) -> int:
        """Input embedding plus LM head (one matrix when tied)."""
        return self.vocab * self.hidden * (1 if self.tie_embeddings else 2)

    @property
    def norm_params(self) -> int:
        return self.num_layers * 2 * self.hidden + self.hidden

    @property
    def params(self) -> int:
        return self.num_layers * self.linear_params_per_layer + self.embedding_params + self.norm_params

    @property
    def active_params(self) -> int:
        return self.num_layers * self.active_linear_params_per_layer + self.embedding_params + self.norm_params

    @property
    def matmul_params_per_token(self) -> int:
        """Weights each token multiplies through: active decoder linears plus the LM head."""
        return self.num_layers * self.active_linear_params_per_layer + self.vocab * self.hidden

    # ---- bytes ----
    def weight_bytes(self, quantization: str | None = None) -> float:
        fmt = weight_format(quantization, self.dtype_bytes)
        linear = self.num_layers * self.linear_params_per_layer
        rest = self.embedding_params + self.norm_params
        return linear * bytes_per_param(fmt) + rest * self.dtype_bytes

    def expert_weight_bytes(self, quantization: str | None = None) -> float:
        """Bytes of all experts' MLP weights (what a MoE step reads only partly)."""
        if self.num_experts <= 1:
            return 0.0
        fmt = weight_format(quantization, self.dtype_bytes)
        return self.num_layers * self.num_experts * self.expert_params * bytes_per_param(fmt)

    @property
    def kv_bytes_per_token(self) -> float:
        """2 (K and V) * layers * kv_heads * head_dim * bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def kv_bytes_per_token_per_rank(self, tp: int, pp: int) -> float:
        # KV heads shard across TP ranks but are replicated when TP exceeds their number.
        kv_heads_per_rank = max(1, -(-self.num_kv_heads // tp))
        layers_per_stage = -(-self.num_layers // pp)
        return 2 * layers_per_stage * kv_heads_per_rank * self.head_dim * self.dtype_bytes


def weight_format(quantization: str | None, dtype_bytes: float = 2.0) -> str:
    if quantization is None or quantization in ("bf16", "fp16", "none", "auto"):
        return "fp32" if dtype_bytes == 4.0 else "bf16"
    if quantization == "fp32":
        return "fp32"
    fmt = QUANT_ALIASES.get(quantization)
    if fmt is None:
        raise ModelConfigError(f"unknown quantization {quantization!r}; known: bf16, {', '.join(QUANT_ALIASES)}")
    return fmt


def bytes_per_param(fmt: str) -> float:
    b = WEIGHT_BYTES[fmt]
    return b + 2.0 / INT4_GROUP_SIZE if fmt == "int4" else b


# ---- config.json (edge) -------------------------------------------------------------------------

PositiveInt = Annotated[int, Field(gt=0)]


class _HFConfig(BaseModel):
    # HF configs carry many keys we do not need; only the named ones are validated.
    model_config = ConfigDict(extra="ignore")
    num_hidden_layers: PositiveInt
    hidden_size: PositiveInt
    intermediate_size: PositiveInt
    num_attention_heads: PositiveInt
    num_key_value_heads: PositiveInt | None = None
    head_dim: PositiveInt | None = None
    vocab_size: PositiveInt
    tie_word_embeddings: bool = False
    attention_bias: bool | None = None
    model_type: str = "llama"
    num_local_experts: PositiveInt | None = None
    num_experts_per_tok: PositiveInt | None = None
    max_position_embeddings: PositiveInt = 4096
    torch_dtype: str | None = None
    dtype: str | None = None  # newer transformers write `dtype` instead of `torch_dtype`


def shape_from_hf_config(data: object, name: str = "model") -> ModelShape:
    try:
        c = _HFConfig.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        path = ".".join(str(p) for p in first["loc"])
        raise ModelConfigError(f"invalid model config {name}: {path}: {first['msg']}") from None
    head_dim = c.head_dim or c.hidden_size // c.num_attention_heads
    # Qwen2 always has q/k/v bias; Llama says so in attention_bias.
    qkv_bias = c.attention_bias if c.attention_bias is not None else c.model_type == "qwen2"
    return ModelShape(
        name=name,
        num_layers=c.num_hidden_layers,
        hidden=c.hidden_size,
        intermediate=c.intermediate_size,
        num_heads=c.num_attention_heads,
        num_kv_heads=c.num_key_value_heads or c.num_attention_heads,
        head_dim=head_dim,
        vocab=c.vocab_size,
        tie_embeddings=c.tie_word_embeddings,
        qkv_bias=qkv_bias,
        num_experts=c.num_local_experts or 1,
        experts_per_token=c.num_experts_per_tok or 1,
        max_position_embeddings=c.max_position_embeddings,
        dtype_bytes=4.0 if (c.dtype or c.torch_dtype) == "float32" else 2.0,
    )


def shipped_model_names() -> list[str]:
    folder = resources.files("hbmserve.capacity.perf").joinpath("data", "models")
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def load_model_shape(name_or_path: str | os.PathLike[str]) -> ModelShape:
    """A shipped shape by name (`llama-3.1-70b`), a config.json path, or a folder holding one."""
    text = str(name_or_path)
    p = Path(os.path.expanduser(text))
    if p.is_dir():
        p = p / "config.json"
    if p.is_file():
        label = p.parent.name if p.name == "config.json" else p.stem
        return _shape_from_file(p, label)
    key = text.strip().lower()
    if key in shipped_model_names():
        raw = resources.files("hbmserve.capacity.perf").joinpath("data", "models", f"{key}.json").read_text()
        return shape_from_hf_config(json.loads(raw), key)
    raise ModelConfigError(
        f"model config {text!r} is neither a config.json file nor a shipped shape "
        f"({', '.join(shipped_model_names())})"
    )


def _shape_from_file(p: Path, label: str) -> ModelShape:
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ModelConfigError(f"cannot read model config {p}: {err}") from None
    return shape_from_hf_config(data, label)
