"""Model shapes from config.json, checked against hand-computed parameter and byte counts."""

from __future__ import annotations

import json

import pytest

from hbmserve.capacity.perf.model_shape import (
    ModelConfigError,
    load_model_shape,
    shape_from_hf_config,
    shipped_model_names,
)


def test_shipped_shapes_include_the_issue_models():
    names = set(shipped_model_names())
    assert {"llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen2.5-32b", "mixtral-8x7b"} <= names


def test_llama_8b_parameter_count_by_hand():
    m = load_model_shape("llama-3.1-8b")
    h, i, v, L = 4096, 14336, 128256, 32
    attn = h * h + 2 * h * 1024 + h * h  # q, k, v (8 KV heads x 128), o
    mlp = 3 * h * i
    expected = L * (attn + mlp + 2 * h) + 2 * v * h + h
    assert m.params == expected
    assert 8.02e9 < m.params < 8.04e9  # published: 8.03B


@pytest.mark.parametrize("name,published_b,tol", [
    ("llama-3.1-70b", 70.6, 0.1), ("llama-3.1-405b", 405.9, 0.2), ("mixtral-8x7b", 46.7, 0.1),
])
def test_published_sizes(name, published_b, tol):
    assert abs(load_model_shape(name).params / 1e9 - published_b) < tol


def test_mixtral_active_parameters_count_two_experts():
    m = load_model_shape("mixtral-8x7b")
    h, i = 4096, 14336
    assert m.params - m.active_params == 32 * 6 * 3 * h * i  # six idle experts per layer
    assert 12.8e9 < m.active_params < 13.0e9  # published: 12.9B active


def test_kv_bytes_per_token_formula():
    # 2 * layers * kv_heads * head_dim * bytes
    assert load_model_shape("llama-3.1-70b").kv_bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert load_model_shape("llama-3.1-8b").kv_bytes_per_token == 2 * 32 * 8 * 128 * 2


def test_kv_per_rank_shards_heads_and_layers_and_replicates_when_tp_exceeds_kv_heads():
    m = load_model_shape("llama-3.1-70b")
    assert m.kv_bytes_per_token_per_rank(4, 1) == 2 * 80 * 2 * 128 * 2
    assert m.kv_bytes_per_token_per_rank(2, 2) == 2 * 40 * 4 * 128 * 2
    assert m.kv_bytes_per_token_per_rank(16, 1) == 2 * 80 * 1 * 128 * 2


def test_weight_bytes_per_format_by_hand():
    m = load_model_shape("llama-3.1-8b")
    linear = 32 * m.linear_params_per_layer
    rest = m.params - linear  # embeddings, LM head, norms stay bf16
    assert m.weight_bytes() == pytest.approx(2 * m.params)
    assert m.weight_bytes("fp8") == pytest.approx(linear * 1 + rest * 2)
    assert m.weight_bytes("int8") == pytest.approx(linear * 1 + rest * 2)
    assert m.weight_bytes("int4") == pytest.approx(linear * (0.5 + 2 / 128) + rest * 2)
    assert m.weight_bytes("awq") == m.weight_bytes("int4")


def test_qwen2_has_qkv_bias():
    m = load_model_shape("qwen2.5-32b")
    assert m.qkv_bias
    assert m.attention_params_per_layer == 5120 * 5120 * 2 + 2 * 5120 * 1024 + (5120 + 2 * 1024)


def test_config_json_from_a_folder_and_float32(tmp_path):
    cfg = {"num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2,
           "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 512, "dtype": "float32"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = load_model_shape(tmp_path)
    assert m.dtype_bytes == 4.0
    assert m.kv_bytes_per_token == 2 * 2 * 2 * 64 * 4


def test_bad_config_names_the_field():
    with pytest.raises(ModelConfigError, match="hidden_size"):
        shape_from_hf_config({"num_hidden_layers": 2, "intermediate_size": 1, "num_attention_heads": 1,
                              "vocab_size": 1}, "bad")
    with pytest.raises(ModelConfigError, match="neither"):
        load_model_shape("no-such-model")
    with pytest.raises(ModelConfigError, match="quantization"):
        load_model_shape("llama-3.1-8b").weight_bytes("fp3")
