"""A replica's weights go through the node's cache before its engine starts (no Ray started:
Ray's metric objects only record once a worker exports them)."""

from __future__ import annotations

from pathlib import Path

from hbmserve.core.cache_spec import WeightCacheSpec
from hbmserve.core.config import ModelSpec
from hbmserve.deployments.replica.replica_weights import local_weights


def _model(source: str, engine: str = "vllm-cpu") -> ModelSpec:
    extra = {"sim": {"gpu": "h100-sxm", "model_config_name": "llama-3.1-8b"}} if engine == "sim" else {}
    return ModelSpec.model_validate({"name": "m", "source": source, "engine": engine, **extra})


def test_the_engine_reads_the_cache_entry_and_the_second_replica_on_a_node_hits(tmp_path: Path) -> None:
    src = tmp_path / "model"
    src.mkdir()
    (src / "config.json").write_text('{"model_type": "llama"}')
    (src / "model.safetensors").write_bytes(b"\0" * 4096)
    cache = WeightCacheSpec(root=str(tmp_path / "cache"))
    first, second = local_weights(_model(str(src)), cache), local_weights(_model(str(src)), cache)
    assert first is not None and second is not None
    engine_dir = Path(first.model.source)
    assert engine_dir.is_relative_to(tmp_path / "cache") and engine_dir != src
    assert (engine_dir / "model.safetensors").read_bytes() == b"\0" * 4096
    assert (first.resolved.hit, second.resolved.hit) == (False, True)
    assert second.model.source == first.model.source and first.model.name == "m"
    first.resolved.release(), second.resolved.release()


def test_the_simulated_engine_has_no_weights_to_resolve(tmp_path: Path) -> None:
    assert local_weights(_model("sim", "sim"), WeightCacheSpec(root=str(tmp_path / "cache"))) is None
    assert not (tmp_path / "cache").exists()


def test_adapters_come_through_the_cache_too_and_are_released_with_the_model(tmp_path: Path) -> None:
    base, sql = tmp_path / "model", tmp_path / "adapters" / "sql"
    for d, name in ((base, "model.safetensors"), (sql, "adapter_model.safetensors")):
        d.mkdir(parents=True)
        (d / name).write_bytes(b"\1" * 1024)
    (sql / "adapter_config.json").write_text('{"r": 8}')
    model = ModelSpec.model_validate({"name": "m", "source": str(base), "engine": "vllm-cpu",
                                      "adapters": [{"name": "sql", "source": str(sql), "max_rank": 8}]})
    local = local_weights(model, WeightCacheSpec(root=str(tmp_path / "cache")))
    assert local is not None and len(local.adapters) == 1
    (adapter,) = local.model.adapters
    here = Path(adapter.source)
    assert here.is_relative_to(tmp_path / "cache") and (here / "adapter_config.json").read_text() == '{"r": 8}'
    assert (adapter.name, adapter.max_rank) == ("sql", 8) and Path(local.model.source) != here
    local.release()


def test_a_missing_adapter_names_itself_and_holds_no_lease(tmp_path: Path) -> None:
    import pytest

    from hbmserve.weights.errors import WeightCacheError

    base = tmp_path / "model"
    base.mkdir()
    (base / "model.safetensors").write_bytes(b"\1" * 64)
    model = ModelSpec.model_validate({"name": "m", "source": str(base), "engine": "vllm-cpu",
                                      "adapters": [{"name": "gone", "source": str(tmp_path / "nope")}]})
    with pytest.raises(WeightCacheError, match="nope"):
        local_weights(model, WeightCacheSpec(root=str(tmp_path / "cache")))
