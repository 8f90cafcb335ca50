"""The generated tiny model: deterministic, Llama-shaped, and a working tokenizer + chat template."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from hbmserve.cluster.tiny_model import TinyModelShape, is_model_dir, write_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_model(tmp_path_factory.mktemp("tiny") / "model")


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_generation_is_deterministic(tiny: Path, tmp_path: Path):
    again = write_model(tmp_path / "again")
    assert _digest(again) == _digest(tiny)


def test_config_has_shapes_vllm_cpu_accepts(tiny: Path):
    cfg = json.loads((tiny / "config.json").read_text())
    shape = TinyModelShape()
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 64  # CPU attention rejects 16
    assert cfg["num_hidden_layers"] == shape.num_hidden_layers
    assert cfg["vocab_size"] == shape.vocab_size
    assert is_model_dir(tiny)
    assert not is_model_dir(tiny.parent)


def test_weights_have_llama_parameter_count(tiny: Path):
    from safetensors import safe_open

    s = TinyModelShape()
    with safe_open(str(tiny / "model.safetensors"), "pt") as f:
        total = sum(f.get_tensor(k).numel() for k in f.keys())
    h, i, v, n = s.hidden_size, s.intermediate_size, s.vocab_size, s.num_hidden_layers
    per_layer = 4 * h * h + 3 * h * i + 2 * h  # q,k,v,o + gate,up,down + two RMSNorms
    assert total == 2 * v * h + n * per_layer + h  # embed + lm_head + layers + final norm


def test_tokenizer_round_trips_and_chat_template_renders(tiny: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny))
    text = "the model and its cache live in memory!"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert max(ids) < TinyModelShape().vocab_size
    # Trained merges compress text well below one token per byte.
    assert len(ids) < len(text.encode()) / 2
    prompt = tok.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False,
                                     add_generation_prompt=True)
    assert prompt == "<|start|>user\nhello<|end|>\n<|start|>assistant\n"


def test_a_larger_shape_in_shards_like_a_real_checkpoint(tmp_path: Path):
    """What ops/bench/weight_load.py asks for, scaled down: other dimensions and shards."""
    import json as _json

    from safetensors import safe_open

    s = TinyModelShape(hidden_size=256, intermediate_size=512, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=4, vocab_size=1024)
    out = write_model(tmp_path / "m", s, max_shard_size="1MB")
    shards = sorted(out.glob("*.safetensors"))
    index = _json.loads((out / "model.safetensors.index.json").read_text())
    assert len(shards) > 1 and set(index["weight_map"].values()) == {p.name for p in shards}
    total = 0
    for p in shards:
        with safe_open(str(p), "pt") as f:
            total += sum(f.get_tensor(k).numel() for k in f.keys())
    h, i, v, n = s.hidden_size, s.intermediate_size, s.vocab_size, s.num_hidden_layers
    assert total == 2 * v * h + n * (4 * h * h + 3 * h * i + 2 * h) + h
    assert _json.loads((out / "config.json").read_text())["num_hidden_layers"] == 3


def test_a_tiny_lora_is_peft_shaped_seeded_and_nonzero(tmp_path):
    import json

    from safetensors.torch import load_file

    from hbmserve.cluster.tiny_model import TinyModelShape, write_lora

    shape = TinyModelShape()
    a, b = write_lora(tmp_path / "a", shape, rank=8, seed=1), write_lora(tmp_path / "b", shape, rank=8, seed=2)
    cfg = json.loads((a / "adapter_config.json").read_text())
    assert (cfg["peft_type"], cfg["r"], cfg["target_modules"]) == ("LORA", 8, ["q_proj", "v_proj"])
    ta, tb = load_file(str(a / "adapter_model.safetensors")), load_file(str(b / "adapter_model.safetensors"))
    key = "base_model.model.model.layers.1.self_attn.v_proj"
    assert tuple(ta[f"{key}.lora_A.weight"].shape) == (8, shape.hidden_size)
    assert tuple(ta[f"{key}.lora_B.weight"].shape) == (shape.num_key_value_heads * shape.head_dim, 8)
    assert len(ta) == 2 * 2 * shape.num_hidden_layers and ta[f"{key}.lora_B.weight"].abs().sum() > 0
    assert not (ta[f"{key}.lora_B.weight"] == tb[f"{key}.lora_B.weight"]).all()  # seeds give different adapters
    assert (load_file(str(write_lora(tmp_path / "a2", shape, seed=1) / "adapter_model.safetensors"))[
        f"{key}.lora_A.weight"] == ta[f"{key}.lora_A.weight"]).all()
