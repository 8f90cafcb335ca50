"""Measured start-up figures into the policy's `startup_s`, and the sleeping hot standby: the
config, the policy's start-up, the simulator's promotion and bill, the live policy's wake."""

from __future__ import annotations

import numpy as np
import pytest

from hbmserve.autoscale.policy_config import autoscale_config_for
from hbmserve.capacity.traces.arrivals import Arrivals
from hbmserve.capacity.perf.engine_core import EngineConfig
from hbmserve.capacity.perf.hardware import get_gpu
from hbmserve.capacity.perf.model_shape import load_model_shape
from hbmserve.capacity.perf.perf_model import Deployment
from hbmserve.capacity.perf.startup_measured import (ASSUMED_NODE_READY_S, load_measured, startup_estimate,
                                                startup_inputs_for)
from hbmserve.core.config import ConfigError, ModelSpec, parse_cluster_spec
from hbmserve.core.scaling import ReplicaState, ScaleDecision, Tier
from hbmserve.capacity.sim.cluster_sim import PolicyBinding, SimCluster, simulate
from hbmserve.core.config import SloSeconds

# A measurement as ops/bench/cold_start.py writes it (the figures are this test's own).
MEASURED = {
    "_source": "test", "engine": "vllm-cpu", "model_bytes": 2_000_000, "rounds": 1,
    "tiers": {"cold": {"weights_local_s": 0.4, "engine_s": 20.0, "serving_s": 31.0, "first_token_s": 31.5},
              "warm": {"weights_local_s": 0.01, "engine_s": 20.0, "serving_s": 30.0, "first_token_s": 30.3},
              "hot": {"weights_local_s": 0.0, "engine_s": 0.0, "serving_s": 1.2, "first_token_s": 1.2}},
    "disk": {"_source": "test disk", "gbps": 0.8, "load_efficiency": 0.9},
}


def _model(engine: str = "vllm-cpu", **auto) -> ModelSpec:
    extra = {"parallelism": {"tp": 4}, "hardware": {"gpu": "h100-sxm"},
             "sim": {"model_config_name": "llama-3.1-70b"},
             "engine_settings": {"dtype": "bfloat16"}} if engine != "vllm-cpu" else {}
    return ModelSpec.model_validate({"name": "m", "source": "/nonexistent/model", "engine": engine,
                                     "autoscaling": {"min_replicas": 1, "max_replicas": 4, **auto}, **extra})


def test_vllm_cpu_start_ups_are_the_measured_ones():
    s = startup_estimate(_model(), get_gpu("h100-sxm"), MEASURED)  # the GPU is unused on CPU
    own = 2e6 / (0.8 * 0.9 * 1e9)  # reading the measured model itself, inside serving_s
    assert s[Tier.WARM] == pytest.approx(30.0 - own + own)
    assert s[Tier.COLD] == pytest.approx(0.4 + 30.0)  # the measured fetch on top of a warm start
    # Hot: the measured request-to-first-token of a promoted standby, less an idle engine's
    # first token (warm: 30.3 - 30.0).
    assert s[Tier.HOT] == pytest.approx(1.2 - 0.3)


def test_a_gpu_model_takes_bytes_from_its_shape_and_labels_its_assumptions():
    m = _model("vllm-gpu")
    i = startup_inputs_for(m, get_gpu("h100-sxm"), MEASURED)
    assert i.weights_bytes == pytest.approx(load_model_shape("llama-3.1-70b").weight_bytes(), rel=1e-9)
    assert 135e9 < i.weights_bytes < 145e9  # 70B parameters in bf16
    assert i.node_ready_s == ASSUMED_NODE_READY_S and i.sources["node_ready_s"] == "assumed"
    assert "not measured" in i.sources["wake"] and i.sources["promote_s"].startswith("measured")
    assert i.devices == 4 and i.has_sleep_mode


def test_a_sleeping_standby_plans_with_its_wake_time():
    loaded = startup_estimate(_model("vllm-gpu"), get_gpu("h100-sxm"), MEASURED)
    asleep = startup_estimate(_model("vllm-gpu", hot_standby={"min": 0, "max": 1, "sleep": True}),
                              get_gpu("h100-sxm"), MEASURED)
    i = startup_inputs_for(_model("vllm-gpu"), get_gpu("h100-sxm"), MEASURED)
    assert asleep[Tier.HOT] == pytest.approx(loaded[Tier.HOT] + i.wake_s())
    assert asleep[Tier.WARM] == loaded[Tier.WARM] and asleep[Tier.COLD] == loaded[Tier.COLD]


def test_the_estimate_is_used_only_where_the_config_states_no_start_up():
    estimate = {Tier.HOT: 0.7, Tier.WARM: 33.0, Tier.COLD: 40.0}
    unstated = autoscale_config_for(_model(), estimated_startup_s=estimate)
    assert (unstated.startup_hot_s, unstated.startup_warm_s, unstated.startup_cold_s) == (0.7, 33.0, 40.0)
    stated = autoscale_config_for(_model(startup_s={"hot": 1, "warm": 2, "cold": 3}),
                                  estimated_startup_s=estimate)
    assert (stated.startup_hot_s, stated.startup_warm_s, stated.startup_cold_s) == (1, 2, 3)
    schema = autoscale_config_for(_model())
    assert (schema.startup_hot_s, schema.startup_warm_s, schema.startup_cold_s) == (5.0, 45.0, 180.0)


def test_the_checked_in_measurement_gives_an_ordered_estimate():
    measured = load_measured()
    if measured is None:
        pytest.skip("capacity/perf/data/startup_measured.json not written yet")
    s = startup_estimate(_model(), get_gpu("h100-sxm"))
    assert 0 < s[Tier.HOT] <= s[Tier.WARM] <= s[Tier.COLD]
    assert s[Tier.WARM] == pytest.approx(measured["tiers"]["warm"]["serving_s"], rel=0.05)


def test_vllm_cpu_refuses_a_sleeping_standby():
    spec = {"name": "c", "models": [{"name": "m", "source": "/x", "engine": "vllm-cpu",
                                     "autoscaling": {"hot_standby": {"max": 1, "sleep": True}}}]}
    with pytest.raises(ConfigError, match="vLLM-CPU has no sleep mode"):
        parse_cluster_spec(spec)
    spec["models"][0]["engine"] = "vllm-gpu"
    assert parse_cluster_spec(spec).models[0].autoscaling.hot_standby.sleep


def test_a_sleeping_pool_plans_with_the_wakes_its_replicas_measure():
    """The live policy of a model whose standbys sleep gets the start-up model's promotion, and
    replaces the assumed wake with the median of what its replicas measured."""
    import json

    from hbmserve.deployments.control import autoscaling as sa
    from hbmserve.deployments.apps.options import model_options

    spec = parse_cluster_spec({"name": "c", "models": [
        {"name": "m", "source": "/x", "engine": "vllm-gpu", "hardware": {"gpu": "h100-sxm"},
         "autoscaling": {"max_replicas": 3, "hot_standby": {"max": 1, "sleep": True}}}]})
    (m,) = spec.models
    kwargs = model_options(m).autoscaling_config["policy"]["policy_kwargs"]
    gpu_inputs = startup_inputs_for(m, get_gpu("h100-sxm"))
    assert kwargs["promote_s"] == pytest.approx(gpu_inputs.promote_s)
    policy = sa.HbmServeAutoscalingPolicy(**json.loads(json.dumps(kwargs)))  # as Serve hands them over
    assert policy.promote_s == pytest.approx(gpu_inputs.promote_s)
    # Planned (assumed) hot tier: the wake then the promotion.
    assert policy.config.startup_hot_s == pytest.approx(gpu_inputs.wake_s() + gpu_inputs.promote_s)
    # A model whose standbys stay loaded has no wake to measure.
    loaded = m.model_copy(update={"autoscaling": m.autoscaling.model_copy(update={
        "hot_standby": m.autoscaling.hot_standby.model_copy(update={"sleep": False})})})
    assert "promote_s" not in model_options(loaded).autoscaling_config["policy"]["policy_kwargs"]


def _promotion(hot_s: float) -> tuple[float, float]:
    """One active replica and one hot standby; at t=10 the policy asks for two actives. Returns
    (when the standby serves, its billed seconds)."""
    dep = Deployment(load_model_shape("llama-3.1-8b"), get_gpu("h100-sxm"), tp=1)
    eng = EngineConfig(num_blocks=20_000, max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=4096)
    arr = Arrivals(np.array([1.0, 50.0]), np.array([100, 100]), np.array([4, 4]))
    ready: list[float] = []

    def policy(snapshot, state):
        if len(snapshot.replicas) == 2 and all(r.state is ReplicaState.ACTIVE for r in snapshot.replicas) \
                and not ready:
            ready.append(snapshot.now)
        promote = snapshot.now >= 10
        return ScaleDecision(2 if promote else 1, {Tier.HOT: 0 if promote else 1}, "test"), state

    res = simulate(SimCluster(dep, eng, 1, SloSeconds()), arr,
                   PolicyBinding(policy, None, 0.5, 30.0, {Tier.HOT: hot_s, Tier.WARM: 60.0, Tier.COLD: 600.0},
                                 initial_standby={Tier.HOT: 1}))
    standby = res.replicas[1]
    return ready[0], standby.lifetime_s


def test_the_simulator_promotes_a_sleeping_standby_after_its_wake_and_bills_it_as_loaded():
    loaded_at, loaded_bill = _promotion(0.5)
    asleep_at, asleep_bill = _promotion(3.0)
    # Promoted at t=10 by both; ready a start-up later, seen at the next 0.5 s tick.
    assert loaded_at == pytest.approx(10.5) and asleep_at == pytest.approx(13.0)
    # The GPU stays held while it sleeps: the same replica-seconds either way.
    assert asleep_bill == pytest.approx(loaded_bill)
