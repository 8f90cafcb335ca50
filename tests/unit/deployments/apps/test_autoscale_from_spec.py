"""The config file's autoscaling section maps onto the policy config the live system runs."""

from __future__ import annotations

import dataclasses

from hbmserve.autoscale.policy_config import autoscale_config_for
from hbmserve.deployments.control.autoscaling import POLICY_PATH
from hbmserve.deployments.apps.autoscaling_options import live_capacity, serve_autoscaling_config
from hbmserve.core.config import parse_cluster_spec
from hbmserve.deployments.apps.options import model_options


def _model(autoscaling: dict | None):
    spec = parse_cluster_spec({"models": [{
        "name": "m", "source": "/m", "engine": "sim", "replicas": 2, "slo": {"ttft_p95_ms": 1500},
        **({"autoscaling": autoscaling} if autoscaling is not None else {}),
    }]})
    return spec.models[0]


def test_fixed_replicas_have_no_policy():
    m = _model(None)
    assert autoscale_config_for(m) is None
    assert (model_options(m).num_replicas, model_options(m).autoscaling_config) == (2, None)


def test_autoscaling_section_reaches_the_policy():
    m = _model({"min_replicas": 0, "max_replicas": 6, "target_queue_per_replica": 3, "replica_capacity_rps": 2.5,
                "startup_s": {"hot": 2, "warm": 30, "cold": 200}, "upscale_delay_s": 3, "downscale_delay_s": 40,
                "downscale_cooldown_s": 20, "hot_standby": {"min": 1, "max": 2}})
    c = autoscale_config_for(m)
    assert (c.min_replicas, c.max_replicas, c.target_queue_per_replica) == (0, 6, 3)
    assert c.ttft_p95_target_s == 1.5 and c.replica_capacity_rps == 2.5
    assert (c.startup_hot_s, c.startup_warm_s, c.startup_cold_s) == (2, 30, 200)
    assert (c.upscale_delay_s, c.downscale_delay_s, c.downscale_cooldown_s) == (3, 40, 20)
    assert c.tpot_p95_target_s == 0.1  # the SLO's default tpot_p95_ms 100
    assert (c.hot_standby_min, c.hot_standby_max) == (1, 2)
    assert c.warm_pool_max == 0  # warm nodes come from the node autoscaler, not this policy
    opts = model_options(m).autoscaling_config
    # The live policy also gets the capacity model's figures for the shape `engine: sim` stands
    # for: replica capacity by request length, and the TPOT one sequence alone decodes at.
    table, floor = live_capacity(m)
    assert table is not None and 0 < floor < c.tpot_p95_target_s
    assert opts == serve_autoscaling_config(dataclasses.replace(c, tpot_floor_s=floor), table)
    assert opts["policy"]["policy_function"] == POLICY_PATH
    # Serve's own delays are off: the policy's hysteresis is the only one.
    assert opts["upscale_delay_s"] == 0 and opts["downscale_delay_s"] == 0


def test_defaults_keep_at_most_one_hot_standby():
    c = autoscale_config_for(_model({"max_replicas": 4}))
    assert (c.hot_standby_min, c.hot_standby_max, c.warm_pool_max) == (0, 1, 0)


def test_bad_standby_bounds_name_the_field():
    import pytest

    from hbmserve.core.config import ConfigError

    with pytest.raises(ConfigError, match=r"models\.0\.autoscaling\.hot_standby"):
        _model({"max_replicas": 4, "hot_standby": {"min": 3, "max": 1}})
