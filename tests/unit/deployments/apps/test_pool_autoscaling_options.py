"""A disaggregated model whose pools both autoscale deploys both pool deployments on the two-pool
policy (deployments/apps/autoscaling_options.py `pool_autoscaling_config`), each within its own
pool's bounds; with one pool fixed, the other keeps the per-deployment policy."""

from __future__ import annotations

import dataclasses

import pytest

from hbmserve.autoscale.pools.pools_policy import PoolsConfig, pool_config
from hbmserve.capacity.perf.hardware import load_catalog
from hbmserve.capacity.perf.perf_model import cost_model
from hbmserve.capacity.perf.plan_analytic import prefill_capacity_rps
from hbmserve.capacity.perf.scenario import knobs_of, nominal_workload, scenario_for
from hbmserve.core.config import parse_cluster_spec
from hbmserve.core.disagg_spec import Role
from hbmserve.deployments.apps.autoscaling_options import (DEFAULT_PREFILL_TOKENS_PER_S, live_policy,
                                                           live_prefill_rate)
from hbmserve.deployments.apps.model_app import build_model_app
from hbmserve.deployments.apps.options import model_options
from hbmserve.deployments.control.autoscaling import POLICY_PATH
from hbmserve.deployments.control.pool_autoscaling import POOLS_POLICY_PATH, PoolsAutoscalingPolicy

ray_config = pytest.importorskip("ray.serve.config", reason="ray[serve] not installed")


def _spec(prefill: dict, decode: dict, speedup: float = 1.0):
    return parse_cluster_spec({"models": [{
        "name": "m", "source": "/m", "engine": "sim",
        "engine_settings": {"max_model_len": 4096, "max_num_batched_tokens": 2048},
        "sim": {"gpu": "h100-sxm", "model_config_name": "llama-3.1-70b", "speedup": speedup},
        "disaggregation": {"connector": "sim", "prefill": {"parallelism": {"tp": 4}, **prefill},
                           "decode": {"parallelism": {"tp": 4}, **decode}}}]})


def _model(prefill: dict, decode: dict, speedup: float = 1.0):
    return _spec(prefill, decode, speedup).models[0]


BOTH = ({"autoscaling": {"min_replicas": 1, "max_replicas": 3}},
        {"autoscaling": {"min_replicas": 2, "max_replicas": 6, "upscale_delay_s": 2}})


def test_both_pools_autoscaled_run_the_pool_policy_and_its_kwargs_make_the_pools_config():
    model = _model(*BOTH, speedup=2.0)
    prefill, decode = (model_options(model, r.value).autoscaling_config for r in Role)
    assert {prefill["policy"]["policy_function"], decode["policy"]["policy_function"]} == {POOLS_POLICY_PATH}
    # Each pool within its own bounds; Serve's delays off, as for every hbmserve policy.
    assert [(c["min_replicas"], c["max_replicas"]) for c in (prefill, decode)] == [(1, 3), (2, 6)]
    assert all(c["upscale_delay_s"] == c["downscale_delay_s"] == 0.0 for c in (prefill, decode))
    follows, leads = prefill["policy"]["policy_kwargs"], decode["policy"]["policy_kwargs"]
    assert follows["prefill_deployment"] == leads["prefill_deployment"] == "engine-m-prefill"
    assert "pools" not in follows
    # The kwargs round-trip into the PoolsConfig the pools' own live configs make.
    sc = scenario_for(model.pool(Role.PREFILL), load_catalog())
    cost, w = cost_model(sc.deployment), nominal_workload(sc)
    rate = 2.0 * cost.prefill_tokens_per_s(2048, 2048)  # the nominal prompt, x speedup
    # The prefill pool's capacity: its prompts' within the TTFT target, not an aggregated replica's.
    rps = 2.0 * prefill_capacity_rps(cost, knobs_of(sc), w, sc.slo_ttft_s)
    aggregated = live_policy(model.pool(Role.PREFILL)).config
    assert 0 < rps != aggregated.replica_capacity_rps
    want = PoolsConfig(prefill=pool_config(dataclasses.replace(aggregated, replica_capacity_rps=rps), decode=False),
                       decode=pool_config(live_policy(model.pool(Role.DECODE)).config, decode=True),
                       prefill_tokens_per_s=rate)
    assert PoolsConfig.from_dict(leads["pools"]) == want
    assert want.decode.upscale_delay_s == 2.0 and want.prefill.tpot_p95_target_s is None
    assert leads["prompt_mean_tokens"] == 2048.0
    # Serve takes the options, and its controller builds both policies from the kwargs.
    for c in (prefill, decode):
        ray_config.AutoscalingConfig(**c)
    assert PoolsAutoscalingPolicy(**leads).config == want and PoolsAutoscalingPolicy(**follows).config is None


def test_the_app_deploys_both_pools_on_the_pool_policy():
    spec = _spec(*BOTH)
    app = build_model_app(spec, spec.models[0], "t" * 32)
    decode = app._bound_deployment
    (prefill,) = [a._bound_deployment for a in decode.init_args if hasattr(a, "_bound_deployment")]
    for d in (prefill, decode):
        assert d._deployment_config.autoscaling_config.policy.policy_function == POOLS_POLICY_PATH


def test_with_one_pool_fixed_the_other_keeps_its_own_policy():
    model = _model({"replicas": 2}, BOTH[1])
    assert model_options(model, "prefill").num_replicas == 2
    assert model_options(model, "decode").autoscaling_config["policy"]["policy_function"] == POLICY_PATH


def test_a_pool_the_capacity_model_does_not_know_gets_the_default_rate():
    pool = _model(*BOTH).pool(Role.PREFILL).model_copy(update={"sim": _model(*BOTH).sim.model_copy(
        update={"gpu": "no-such-gpu"})})
    assert live_prefill_rate(pool) == (DEFAULT_PREFILL_TOKENS_PER_S, 2048.0, None)


def test_a_stated_prefill_capacity_stands():
    model = _model({"autoscaling": {"min_replicas": 1, "max_replicas": 3, "replica_capacity_rps": 0.5}}, BOTH[1])
    leads = model_options(model, "decode").autoscaling_config["policy"]["policy_kwargs"]
    assert PoolsConfig.from_dict(leads["pools"]).prefill.replica_capacity_rps == 0.5
