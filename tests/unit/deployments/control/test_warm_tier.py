"""The warm-tier aggregator's pieces that need no cluster (deployments/control/warm_tier.py): which models
are warmable, each model's wish from its decision, replica shapes, and the prefetch itself (run
here on a local source into a temporary cache)."""

from __future__ import annotations

from hbmserve.autoscale.warm_nodes import cluster_request
from hbmserve.core.config import parse_cluster_spec
from hbmserve.core.records import DecisionRecord, Prefetch
from hbmserve.core.scaling import Tier
from hbmserve.deployments.control import warm_tier as wt
from hbmserve.deployments.wire.resources import replica_shape

WARM = {"min_replicas": 0, "max_replicas": 2, "warm_pool": {"min": 1, "max": 1}}


def spec(tmp_path, **over):
    models = [
        {"name": "gpu-sim", "source": str(tmp_path / "m"), "engine": "sim", "autoscaling": WARM,
         "sim": {"reserve_gpus": True, "cache_weights": True}},
        {"name": "cpu-sim", "source": "simulated", "engine": "sim", "autoscaling": WARM},  # needs no node
        {"name": "fixed", "source": "/m", "engine": "vllm-gpu", "replicas": 2, "parallelism": {"tp": 2}},
    ]
    return parse_cluster_spec({"models": models, "cache": {"root": str(tmp_path / "cache")}, **over})


def test_only_models_with_a_warm_pool_a_node_shape_and_cached_weights_are_warmable(tmp_path):
    s = spec(tmp_path)
    assert [m.name for m in s.models if wt.warmable(s, m)] == ["gpu-sim"]
    assert wt.wants_warm_tier(s)
    no_cache = s.model_copy(update={"models": [m.model_copy(update={"sim": m.sim.model_copy(
        update={"cache_weights": False})}) for m in s.models]})
    assert not wt.wants_warm_tier(no_cache)


def test_replica_shapes_are_what_ray_schedules(tmp_path):
    s = spec(tmp_path)
    assert replica_shape(s.model("gpu-sim")) == ({"CPU": 0.0, "GPU": 1.0},)
    assert replica_shape(s.model("cpu-sim")) == ({"CPU": 0.0, "GPU": 0.0},)
    # vLLM on 2 GPUs: the replica actor (1 CPU) and one GPU per rank worker beside it.
    assert replica_shape(s.model("fixed")) == ({"CPU": 1.0, "GPU": 0.0}, {"GPU": 1.0}, {"GPU": 1.0})


def test_every_model_is_in_the_one_request(tmp_path, monkeypatch):
    s = spec(tmp_path)
    decision = DecisionRecord(at=1.0, target_active=1, target_standby={Tier.HOT: 0, Tier.WARM: 1},
                              active_replicas=("r1",), standby_replicas=(), reason="", serve_target=1)
    monkeypatch.setattr(wt, "latest_decision", lambda app, dep: decision if app == "gpu-sim" else None)
    request = cluster_request([wt.wish_of(m) for m in s.models])
    # gpu-sim: 1 active + 1 warm node; fixed: 2 replicas of (1 CPU, 2 x 1 GPU); cpu-sim: nothing.
    assert request.bundles == ({"CPU": 1.0}, {"GPU": 1.0}, {"GPU": 1.0}) * 2 + ({"GPU": 1.0},) * 2


def test_prefetch_fills_the_nodes_cache_and_pins_it(tmp_path):
    from hbmserve.weights.resolve import cache_for

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"w" * 4096)
    s = spec(tmp_path)
    first = [Prefetch.from_dict(p) for p in wt.prefetch("node-1", [("gpu-sim", str(model))], s.cache.model_dump_json())]
    assert [(p.model, p.ok, p.hit) for p in first] == [("gpu-sim", True, False)] and first[0].bytes_fetched >= 4096
    again = wt.prefetch("node-1", [("gpu-sim", str(model))], s.cache.model_dump_json())
    assert Prefetch.from_dict(again[0]).hit
    (entry,) = cache_for(s.cache).entries.iterdir()
    assert (cache_for(s.cache).pins / entry.name).exists()  # kept for the warm pool
    bad = Prefetch.from_dict(wt.prefetch("node-1", [("x", str(tmp_path / "nope"))], s.cache.model_dump_json())[0])
    assert not bad.ok and "nope" in bad.error
