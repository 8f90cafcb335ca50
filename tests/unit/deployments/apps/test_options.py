"""Every path that deploys a model builds its Serve options through deployments/apps/options.py, so the same
model gets the same autoscaling config, health checks, shutdown and names on each.

The start-up drift this guards against: the slot path of a placed, autoscaled model once built
its policy without the start-up model's seconds per tier (hot / warm / cold 5 / 45 / 180 s, the
schema's defaults), while the same model unplaced got them (1.4 / 35.8 / 161 s for the model below,
measured on that code): the first test here fails there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import hbmserve.placement as placement_pkg
from hbmserve.deployments.apps.declarative import MIN_TOKEN_CHARS, model_app, serve_config
from hbmserve.deployments.apps.model_app import build_model_app
from hbmserve.deployments.apps.options import (ENGINE_HEALTH_CHECK_PERIOD_S, ENGINE_HEALTH_CHECK_TIMEOUT_S, ENGINE_SHUTDOWN_S,
                                   model_options, slot_options)
from hbmserve.deployments.apps.placed_app import placed_specs, plan_model
from hbmserve.autoscale.policy_config import autoscale_config_for
from hbmserve.deployments.control.autoscaling import HbmServeAutoscalingPolicy
from hbmserve.core.config import parse_cluster_spec
from hbmserve.core.scaling import Tier
from hbmserve.placement.cluster_file import load_cluster_file

PAIRS = Path(placement_pkg.__file__).parent / "data" / "cluster_nvlink_pairs_x2.yaml"
SCALED = {"name": "m", "source": "/m", "engine": "sim", "sim": {"reserve_gpus": True, "gpu": "H100-SXM"},
          "parallelism": {"tp": 2}, "autoscaling": {"min_replicas": 1, "max_replicas": 2}}


def _spec(**model):
    return parse_cluster_spec({"topology": str(PAIRS), "models": [{**SCALED, **model}]})


def _slots(model):
    topology = load_cluster_file(PAIRS)
    return slot_options(model, placed_specs(model, plan_model(model, topology), topology))


def _live_config(autoscaling_config: dict):
    """The AutoscaleConfig the policy Serve builds from these options runs with."""
    kwargs = autoscaling_config["policy"]["policy_kwargs"]
    return HbmServeAutoscalingPolicy(**kwargs.get("leader", kwargs) or {}).config


def test_a_placed_autoscaled_model_plans_with_what_it_would_unplaced():
    model = _spec().models[0]
    unplaced = _live_config(model_options(model).autoscaling_config)
    leader = _slots(model)[0].autoscaling_config["policy"]["policy_kwargs"]["leader"]
    assert leader == model_options(model).autoscaling_config["policy"]["policy_kwargs"]
    slotted = HbmServeAutoscalingPolicy(**leader).config
    assert slotted == unplaced
    # Derived, not assumed: the start-up model's seconds, not the schema's defaults, on both.
    schema_default = autoscale_config_for(model)
    assert unplaced.startup_s != schema_default.startup_s
    assert set(unplaced.startup_s) == set(Tier)


def test_a_stated_startup_wins_on_every_path():
    model = _spec(autoscaling={**SCALED["autoscaling"], "startup_s": {"hot": 2, "warm": 20, "cold": 200}}).models[0]
    for config in (_live_config(model_options(model).autoscaling_config),
                   _live_config(_slots(model)[0].autoscaling_config)):
        assert config.startup_s == {Tier.HOT: 2.0, Tier.WARM: 20.0, Tier.COLD: 200.0}


@pytest.mark.parametrize("autoscaling", [None, SCALED["autoscaling"]])
def test_every_engine_deployment_has_the_same_lifecycle(autoscaling):
    model = _spec(autoscaling=autoscaling, replicas=2).models[0]
    for options in (model_options(model), *_slots(model)):
        kwargs = options.serve_kwargs()
        assert (kwargs["health_check_period_s"], kwargs["health_check_timeout_s"],
                kwargs["graceful_shutdown_timeout_s"]) == (ENGINE_HEALTH_CHECK_PERIOD_S,
                                                           ENGINE_HEALTH_CHECK_TIMEOUT_S, ENGINE_SHUTDOWN_S)
    assert [o.name for o in _slots(model)] == ["engine-m-r0", "engine-m-r1"]
    assert model_options(model).name == "engine-m"


def test_serve_config_builds_the_deployment_deploy_builds(tmp_path):
    """The declarative builder (serve-config, the Helm chart) and `hbmserve deploy`'s give one
    deployment config for an unplaced model."""
    spec = parse_cluster_spec({"models": [{**SCALED, "parallelism": {"tp": 1}}]})
    token = tmp_path / "token"
    token.write_text("t" * MIN_TOKEN_CHARS)
    (entry, _door) = serve_config(spec, str(token))["applications"]
    declared = model_app(entry["args"])
    deployed = build_model_app(spec, spec.models[0], "t" * MIN_TOKEN_CHARS)
    a, b = declared._bound_deployment, deployed._bound_deployment
    assert a.name == b.name == "engine-m"
    assert a._deployment_config == b._deployment_config
    assert a.ray_actor_options == b.ray_actor_options


def test_a_disaggregated_model_deploys_one_deployment_per_pool_each_as_its_pool_says(tmp_path):
    """Both pools in the model's one application (the decode deployment binds the prefill one),
    each named for its pool, scaled as its pool says, its replicas told their role; the
    declarative builder (serve-config, the Helm chart) builds the same."""
    from hbmserve.core.config import ModelSpec

    spec = parse_cluster_spec({"models": [{
        "name": "m", "source": "/m", "engine": "sim",
        "disaggregation": {"connector": "sim", "prefill": {"replicas": 2},
                           "decode": {"autoscaling": {"min_replicas": 1, "max_replicas": 4}}}}]})
    token = tmp_path / "token"
    token.write_text("t" * MIN_TOKEN_CHARS)
    (entry, _door) = serve_config(spec, str(token))["applications"]
    for app in (build_model_app(spec, spec.models[0], "t" * MIN_TOKEN_CHARS), model_app(entry["args"])):
        decode = app._bound_deployment
        args = decode.init_args
        (prefill,) = [a._bound_deployment for a in args if hasattr(a, "_bound_deployment")]
        assert (decode.name, prefill.name) == ("engine-m-decode", "engine-m-prefill")
        assert prefill._deployment_config.num_replicas == 2 and prefill._deployment_config.autoscaling_config is None
        scaling = decode._deployment_config.autoscaling_config
        assert (scaling.min_replicas, scaling.max_replicas) == (1, 4)
        assert (args[4], prefill.init_args[4]) == ("decode", "prefill")
        pool = ModelSpec.model_validate_json(args[0])
        assert pool.disaggregation is None and pool.autoscaling.max_replicas == 4


def test_ray_resources_pin_a_pools_replicas_and_every_rank_of_a_multi_gpu_engine():
    from hbmserve.core.disagg_spec import Role
    from hbmserve.deployments.wire.resources import replica_shape

    spec = parse_cluster_spec({"models": [{
        "name": "m", "source": "/m", "engine": "vllm-gpu",
        "disaggregation": {"connector": "nixl", "prefill": {"parallelism": {"tp": 4}, "ray_resources": {"p": 1}},
                           "decode": {"ray_resources": {"d": 1}}}}]})
    model = spec.models[0]
    prefill, decode = (model.pool(r) for r in Role)
    # One GPU: the actor holds it, and the resource.
    one = model_options(model, "decode").serve_kwargs()
    assert one["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 1, "resources": {"d": 1.0}}
    assert "placement_group_bundles" not in one and replica_shape(decode) == ({"CPU": 1.0, "GPU": 1.0, "d": 1.0},)
    # TP=4: vLLM's ranks go in the replica's placement group, on one node that offers the resource.
    four = model_options(model, "prefill").serve_kwargs()
    assert "resources" not in four["ray_actor_options"] and four["placement_group_strategy"] == "STRICT_PACK"
    assert four["placement_group_bundles"] == [{"CPU": 1.0, "GPU": 1.0, "p": 0.25}] + [{"GPU": 1.0, "p": 0.25}] * 3
    assert replica_shape(prefill) == tuple(four["placement_group_bundles"])


def test_ray_resources_are_custom_ones_and_not_for_planned_models():
    from hbmserve.core.config import ConfigError

    with pytest.raises(ConfigError, match="models.0.ray_resources.GPU: Value error, GPU is one of Ray's own"):
        parse_cluster_spec({"models": [{"name": "m", "source": "/m", "engine": "sim", "ray_resources": {"GPU": 1}}]})
    with pytest.raises(ConfigError, match="models.0.ray_resources: the placement planner places"):
        _spec(ray_resources={"a": 1})
