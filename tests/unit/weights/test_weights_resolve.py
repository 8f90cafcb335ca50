"""resolve(): what a replica calls before its engine starts; its metrics; the config section."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from hbmserve.core.cache_spec import GIB, WeightCacheSpec
from hbmserve.core.config import ConfigError, parse_cluster_spec
from hbmserve.weights.errors import SourceUnavailable
from hbmserve.weights.cache_metrics import CacheMetrics
from hbmserve.weights.resolve import cache_for, resolve
from hbmserve.weights.sources import SourceOptions

FAST = SourceOptions(attempts=2, backoff_initial_s=0.01, backoff_max_s=0.02, timeout_s=3)


def sample(reg: CollectorRegistry, name: str, model: str) -> float | None:
    return reg.get_sample_value(name, {"model": model})


def test_miss_then_hit_and_the_metrics_say_so(tmp_path, kit) -> None:
    files = kit.model_files()
    src = kit.write_dir(tmp_path / "src", files)
    spec = WeightCacheSpec(root=str(tmp_path / "cache"))
    reg = CollectorRegistry()
    metrics = CacheMetrics(reg)
    seen = []
    first = resolve(str(src), spec, model="tiny", metrics=metrics, progress=lambda n, total: seen.append((n, total)))
    second = resolve(str(src), spec, model="tiny", metrics=metrics)
    total = sum(map(len, files.values()))
    assert (first.hit, second.hit, first.path) == (False, True, second.path)
    assert sum(n for n, _ in seen) == total and {t for _, t in seen} == {total}
    assert all((first.path / k).read_bytes() == v for k, v in files.items())
    assert sample(reg, "hbmserve_weight_cache_hits_total", "tiny") == 1
    assert sample(reg, "hbmserve_weight_cache_misses_total", "tiny") == 1
    assert sample(reg, "hbmserve_weight_cache_fetched_bytes_total", "tiny") == total
    assert sample(reg, "hbmserve_weight_cache_last_fetch_gbps", "tiny") > 0
    # Both replicas hold a lease: the entry shows in use until both let go.
    cache = cache_for(spec)
    assert cache.ls()[0].in_use
    first.release()
    assert cache.ls()[0].in_use
    second.release()
    assert not cache.ls()[0].in_use


def test_metrics_live_in_the_registry_they_are_given() -> None:
    a, b = CollectorRegistry(), CollectorRegistry()
    CacheMetrics(a), CacheMetrics(b)  # no clash: nothing registered globally
    with pytest.raises(ValueError):
        CacheMetrics(a)  # the same registry twice is Prometheus' duplicate error, as it should be


def test_a_warm_node_keeps_serving_when_the_source_is_down(tmp_path, serve_files, kit) -> None:
    server = serve_files(kit.with_manifest(kit.model_files()))
    spec = WeightCacheSpec(root=str(tmp_path / "cache"))
    resolve(server.url, spec, opts=FAST, pin=True).release()
    server.close()
    again = resolve(server.url, spec, opts=FAST)
    again.release()
    assert again.hit and again.offline
    assert cache_for(spec).ls()[0].pinned
    with pytest.raises(SourceUnavailable, match="holds no copy"):
        resolve(server.url, WeightCacheSpec(root=str(tmp_path / "cold")), opts=FAST)


def test_the_config_section_defaults_and_checks() -> None:
    spec = parse_cluster_spec({"models": [{"name": "m", "source": "/m"}]})
    assert spec.cache.root == "~/.cache/hbmserve/weights" and spec.cache.max_bytes == 200 * GIB
    spec = parse_cluster_spec({"cache": {"root": "/nvme/w", "max_gib": 1.5}, "models": [{"name": "m", "source": "/m"}]})
    assert spec.cache.max_bytes == int(1.5 * GIB)
    with pytest.raises(ConfigError, match=r"cache\.root: .*absolute path or start with ~"):
        parse_cluster_spec({"cache": {"root": "rel/dir"}, "models": [{"name": "m", "source": "/m"}]})
    with pytest.raises(ConfigError, match=r"cache\.max_gib"):
        parse_cluster_spec({"cache": {"max_gib": 0}, "models": [{"name": "m", "source": "/m"}]})


def test_a_local_source_is_hashed_once_until_its_files_change(tmp_path, kit, monkeypatch) -> None:
    """A hit from a local directory costs a stat per file, not a read of the whole model."""
    import os

    from hbmserve.weights import sources

    src = kit.write_dir(tmp_path / "src", kit.model_files())
    spec = WeightCacheSpec(root=str(tmp_path / "cache"))
    hashed = []
    real = sources.manifest_of_dir
    monkeypatch.setattr(sources, "manifest_of_dir", lambda root: hashed.append(root) or real(root))
    first = resolve(str(src), spec)
    second = resolve(str(src), spec)
    assert (first.hit, second.hit, len(hashed)) == (False, True, 1)
    changed = next(p for p in sorted(src.iterdir()) if p.is_file())
    changed.write_bytes(changed.read_bytes() + b"x")
    os.utime(changed, ns=(1, 1))
    third = resolve(str(src), spec)
    assert (third.hit, len(hashed)) == (False, 2) and third.path != first.path
