"""Placement wired into serving: the config's `topology` field, and Serve options built from a plan."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import hbmserve.placement as placement_pkg
from hbmserve.cluster.checks import load_deployable
from hbmserve.core.config import ConfigError, load_cluster_spec, parse_cluster_spec
from hbmserve.core.engine_settings import EngineKind
from hbmserve.deployments.apps.options import slot_options
from hbmserve.deployments.wire.names import slot_deployment_name
from hbmserve.deployments.apps.placed_app import infeasible_message, placed_specs, plan_model
from hbmserve.deployments.wire.resources import actor_options
from hbmserve.placement.cluster_file import load_cluster_file

PAIRS = Path(placement_pkg.__file__).parent / "data" / "cluster_nvlink_pairs_x2.yaml"
# The fixture by hand: two 4-GPU nodes, NV4 bridges on GPU0-GPU1 and GPU2-GPU3, SYS otherwise.
NODES = ("pairs-a", "pairs-b")
ISLAND_OF_GPU = {0: 0, 1: 0, 2: 1, 3: 1}


def _config(tmp_path: Path, topology: str | None, model: str) -> Path:
    cfg = tmp_path / "conf" / "cluster.yaml"
    cfg.parent.mkdir(exist_ok=True)
    top = f"topology: {topology}\n" if topology is not None else ""
    cfg.write_text(f"{top}models:\n  - {model}\n")
    return cfg


SIM_TP2 = "{name: m, source: /m, engine: sim, sim: {reserve_gpus: true}, parallelism: {tp: 2}, replicas: 2}"


def test_topology_resolves_relative_to_the_config_file(tmp_path, monkeypatch):
    cfg = _config(tmp_path, "topo/pairs.yaml", SIM_TP2)
    (cfg.parent / "topo").mkdir()
    shutil.copy(PAIRS, cfg.parent / "topo" / "pairs.yaml")
    monkeypatch.chdir(tmp_path)  # not the config's folder
    spec = load_cluster_spec(cfg)
    assert spec.topology == str((cfg.parent / "topo" / "pairs.yaml").resolve())
    assert spec.plans_placement(spec.models[0])


@pytest.mark.parametrize("content", [None, "nodes: []\n", "nodes: [{name: a, nvidia_smi_topo: 'not a table'}]\n"])
def test_bad_topology_is_a_config_error_naming_the_field(tmp_path, content):
    """A missing file fails the schema load; a bad one fails before deploy (load_deployable)."""
    cfg = _config(tmp_path, "cluster-topo.yaml", SIM_TP2)
    if content is not None:
        (cfg.parent / "cluster-topo.yaml").write_text(content)
    with pytest.raises(ConfigError) as err:
        load_deployable(cfg)
    assert "topology:" in str(err.value)
    assert "Traceback" not in str(err.value)


@pytest.mark.parametrize(("model", "topology", "planned"), [
    ({"engine": "vllm-gpu"}, "/t.yaml", True),
    ({"engine": "sim", "sim": {"reserve_gpus": True}}, "/t.yaml", True),
    ({"engine": "sim"}, "/t.yaml", False),  # holds no GPU, nothing to place
    ({"engine": "vllm-cpu"}, "/t.yaml", False),
    ({"engine": "vllm-gpu"}, None, False),  # no topology, Serve places alone
])
def test_which_models_are_planned(model, topology, planned):
    data = {"models": [{"name": "m", "source": "/m", **model}]}
    if topology:
        data["topology"] = topology
    spec = parse_cluster_spec(data)
    assert spec.plans_placement(spec.models[0]) is planned


def test_autoscaling_with_planning_is_accepted_and_planned_at_its_ceiling():
    data = {"topology": "/t.yaml", "models": [{"name": "m", "source": "/m", "engine": "vllm-gpu",
                                               "autoscaling": {"min_replicas": 1, "max_replicas": 3}}]}
    spec = parse_cluster_spec(data)
    assert spec.plans_placement(spec.models[0]) and spec.models[0].replica_ceiling == 3
    result = plan_model(spec.models[0], load_cluster_file(PAIRS))
    assert result.feasible and len(result.replicas) == 3


def test_an_autoscaling_ceiling_the_topology_cannot_hold_is_a_config_error_naming_the_field(tmp_path):
    """The fixture holds 4 NVLink pairs (2 nodes x 2): max_replicas 4 of TP=2 fits, 5 does not."""
    model = ("{name: m, source: /m, engine: sim, sim: {reserve_gpus: true}, parallelism: {tp: 2}, "
             "autoscaling: {min_replicas: 1, max_replicas: %d}}")
    assert load_deployable(_config(tmp_path, str(PAIRS), model % 4)).models[0].replica_ceiling == 4
    with pytest.raises(ConfigError) as err:
        load_deployable(_config(tmp_path, str(PAIRS), model % 5))
    message = str(err.value)
    assert "models.0.autoscaling.max_replicas: model m: no placement for autoscaling.max_replicas=5" in message
    assert "the free GPUs hold 4" in message
    assert "autoscaling.max_replicas=4 (4 replica(s) of TP=2 x PP=1 fit)" in message  # the planner's alternative
    # A fixed count names its own field.
    with pytest.raises(ConfigError, match=r"models\.0\.replicas: model m: no placement for replicas=5"):
        load_deployable(_config(tmp_path, str(PAIRS), SIM_TP2.replace("replicas: 2", "replicas: 5")))


def test_an_autoscaled_planned_model_gets_one_slot_deployment_per_planned_replica():
    from hbmserve.deployments.control.slot_autoscaling import SLOT_POLICY_PATH

    topology = load_cluster_file(PAIRS)
    model = _model(parallelism={"tp": 2}, autoscaling={"min_replicas": 1, "max_replicas": 3})
    result = plan_model(model, topology)
    specs = placed_specs(model, result, topology)
    options = [o.serve_kwargs() for o in slot_options(model, specs)]
    assert [o["name"] for o in options] == ["engine-m-r0", "engine-m-r1", "engine-m-r2"]
    assert all("num_replicas" not in o for o in options)
    assert [(o["autoscaling_config"]["min_replicas"], o["autoscaling_config"]["max_replicas"]) for o in options] \
        == [(1, 1), (0, 1), (0, 1)]
    assert {o["autoscaling_config"]["policy"]["policy_function"] for o in options} == {SLOT_POLICY_PATH}
    # Each slot is pinned to its own planned island, as a fixed planned replica is.
    islands = [o["placement_group_bundles"][0] for o in options]
    assert len({next(k for k in b if k.startswith("nvlink_island:")) for b in islands}) == 3


def _model(**kw):
    data = {"name": "m", "source": "/m", "engine": "sim", "sim": {"reserve_gpus": True}, **kw}
    return parse_cluster_spec({"models": [data]}).models[0]


def test_each_planned_replica_becomes_its_own_pinned_deployment():
    topology = load_cluster_file(PAIRS)
    model = _model(parallelism={"tp": 2}, replicas=2)
    result = plan_model(model, topology)
    assert result.feasible, result.reason
    specs = placed_specs(model, result, topology)
    options = [o.serve_kwargs() for o in slot_options(model, specs)]

    assert [o["name"] for o in options] == ["engine-m-r0", "engine-m-r1"]
    assert all(o["num_replicas"] == 1 for o in options)
    nodes = []
    for stage_plan, o in zip((r.stages[0] for r in result.replicas), options):
        node, gpus = stage_plan.node, stage_plan.gpus
        assert len(gpus) == 2 and {ISLAND_OF_GPU[g] for g in gpus} == {ISLAND_OF_GPU[gpus[0]]}, "TP pair split"
        island = f"nvlink_island:{node}-{ISLAND_OF_GPU[gpus[0]]}"
        assert o["placement_group_bundles"] == [{"GPU": 1.0, island: 1.0}] * 2
        assert o["placement_group_strategy"] == "STRICT_PACK"  # one node
        assert o["placement_group_bundle_label_selector"] == [{"hbmserve.io/node": node}] * 2
        # The simulator holds no GPU itself: the bundles do; vLLM's rank order is the bundle order.
        assert o["ray_actor_options"]["num_gpus"] == 0
        assert o["ray_actor_options"]["runtime_env"] == {"env_vars": {"VLLM_RAY_BUNDLE_INDICES": "0,1"}}
        nodes.append(node)
    assert sorted(nodes) == list(NODES)  # replicas spread over the two nodes


def test_one_gpu_vllm_replica_holds_its_gpu_and_cpu_in_bundle_zero():
    topology = load_cluster_file(PAIRS)
    model = parse_cluster_spec({"models": [{"name": "org/m:1", "source": "/m", "engine": "vllm-gpu"}]}).models[0]
    result = plan_model(model, topology)
    (pg,) = placed_specs(model, result, topology)
    (o,) = [o.serve_kwargs() for o in slot_options(model, (pg,))]
    assert o["name"] == "engine-org-m-1-r0"
    assert o["ray_actor_options"]["num_gpus"] == 1
    cpus = o["ray_actor_options"]["num_cpus"]
    assert cpus == actor_options(model)["num_cpus"] > 0
    # Serve schedules the replica actor in bundle 0, so its CPU must be part of that bundle.
    assert o["placement_group_bundles"][0]["CPU"] == cpus


def test_infeasible_plan_names_reason_and_alternatives():
    topology = load_cluster_file(PAIRS)
    result = plan_model(_model(parallelism={"tp": 4}), topology)
    assert not result.feasible
    message = infeasible_message(_model(parallelism={"tp": 4}), result)
    assert "largest here is 2" in message
    assert result.alternatives and all(f"tp={a.tp} pp={a.pp}" in message for a in result.alternatives)


def test_unplanned_sim_reserves_its_gpus_on_the_actor():
    assert actor_options(_model(parallelism={"tp": 2, "pp": 2}))["num_gpus"] == 4
    assert "num_gpus" not in actor_options(parse_cluster_spec(
        {"models": [{"name": "m", "source": "/m", "engine": "sim"}]}).models[0])
    assert _model().engine is EngineKind.SIM and slot_deployment_name(_model(), 3) == "engine-m-r3"
