"""ClusterSpec: the embedded default, field-path errors, and the CLI's user-facing failure."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from hbmserve.core.config import ClusterSpec, ConfigError, load_cluster_spec, parse_cluster_spec
from hbmserve.core.engine_settings import EngineKind
from hbmserve.cli.serve import register


def _minimal(**model) -> dict:
    return {"models": [{"name": "m", "source": "/models/m", **model}]}


def test_embedded_default_serves_tiny_model_on_cpu():
    spec = load_cluster_spec(None)
    (model,) = spec.models
    assert model.engine is EngineKind.VLLM_CPU
    assert model.source == str(Path("~/.cache/hbmserve/tiny-llama").expanduser())
    assert spec.serve.http.host == "127.0.0.1"
    assert model.engine_settings.max_model_len == 512


def test_every_documented_field_parses(tmp_path: Path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        """
name: prod
serve: {http: {host: 0.0.0.0, port: 9000}, auth: {keys_file: keys.yaml, admin_token_file: /run/admin}}
models:
  - name: llama-70b
    source: meta-llama/Llama-3.1-70B-Instruct
    engine: vllm-gpu
    engine_settings: {max_model_len: 8192, max_num_seqs: 128, max_num_batched_tokens: 8192,
                      enable_chunked_prefill: true, gpu_memory_utilization: 0.92, dtype: bfloat16,
                      quantization: fp8, preemption_mode: swap, kv_offload_gib: 64}
    parallelism: {tp: 4, pp: 2}
    replicas: 2
    autoscaling: {min_replicas: 1, max_replicas: 8}
    slo: {ttft_p95_ms: 1500, tpot_p95_ms: 80}
    hardware: {gpu: h100-sxm, usd_per_gpu_hour: 2.49}
"""
    )
    spec = load_cluster_spec(cfg)
    m = spec.models[0]
    assert (m.parallelism.tp, m.parallelism.pp) == (4, 2)
    assert m.engine_settings.quantization == "fp8"
    assert m.hardware.usd_per_gpu_hour == 2.49
    assert m.autoscaling is not None and m.autoscaling.max_replicas == 8
    # A hub id is not a path and stays as written.
    assert m.source == "meta-llama/Llama-3.1-70B-Instruct"
    # Auth files resolve against the config's folder, as model sources do.
    assert spec.serve.auth is not None and spec.serve.auth.keys_file == str((tmp_path / "keys.yaml").resolve())
    assert spec.serve.auth.admin_token_file == "/run/admin"


def test_relative_source_resolves_against_config_folder(tmp_path: Path):
    (tmp_path / "sub").mkdir()
    cfg = tmp_path / "sub" / "c.yaml"
    cfg.write_text("models: [{name: m, source: ./weights}]\n")
    assert load_cluster_spec(cfg).models[0].source == str((tmp_path / "sub" / "weights").resolve())


@pytest.mark.parametrize(
    ("model", "path", "words"),
    [
        ({"engine": "tpu"}, "models.0.engine", ["'vllm-gpu'", "'vllm-cpu'", "'sim'"]),
        ({"engine_settings": {"max_num_seqs": 0}}, "models.0.engine_settings.max_num_seqs", ["greater than 0"]),
        ({"engine_settings": {"dtype": "fp64"}}, "models.0.engine_settings.dtype", ["'bfloat16'"]),
        ({"parallelism": {"tp": 0}}, "models.0.parallelism.tp", ["greater than or equal to 1"]),
        ({"autoscaling": {"min_replicas": 4, "max_replicas": 2}}, "models.0.autoscaling", ["min_replicas (4)"]),
        ({"engine_settings": {"gpu_memory_utilisation": 0.9}}, "models.0.engine_settings.gpu_memory_utilisation",
         ["unknown field"]),
        ({"engine_settings": {"enable_chunked_prefill": False, "max_num_batched_tokens": 256}},
         "models.0.engine_settings", ["max_num_batched_tokens must be >= max_model_len"]),
    ],
)
def test_bad_field_is_named_with_allowed_values(model, path, words):
    with pytest.raises(ConfigError) as exc:
        parse_cluster_spec(_minimal(**model), "c.yaml")
    text = str(exc.value)
    assert f"  {path}:" in text
    for w in words:
        assert w in text


def test_duplicate_model_names_rejected():
    data = {"models": [{"name": "a", "source": "/x"}, {"name": "a", "source": "/y"}]}
    with pytest.raises(ConfigError, match="repeated: a"):
        parse_cluster_spec(data)


def test_empty_and_non_mapping_configs_rejected(tmp_path: Path):
    with pytest.raises(ConfigError, match="models: List should have at least 1 item"):
        parse_cluster_spec({"models": []})
    cfg = tmp_path / "c.yaml"
    cfg.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_cluster_spec(cfg)
    cfg.write_text("models: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_cluster_spec(cfg)
    with pytest.raises(ConfigError, match="config file not found"):
        load_cluster_spec(tmp_path / "missing.yaml")


def test_cli_bad_config_exits_nonzero_without_traceback(tmp_path: Path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("models: [{name: m, source: /x, engine_settings: {max_model_len: -1}}]\n")
    app = typer.Typer()
    register(app)
    for cmd in (["up", str(cfg)], ["deploy", str(cfg)]):
        result = CliRunner().invoke(app, cmd)
        assert result.exit_code == 2, result.output
        assert "models.0.engine_settings.max_model_len" in result.output
        assert "Traceback" not in result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)


def test_model_lookup_by_name():
    spec = ClusterSpec.model_validate(_minimal())
    assert spec.model("m") is not None
    assert spec.model("other") is None
