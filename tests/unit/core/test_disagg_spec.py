"""A disaggregated model's config (core/disagg_spec.py, issue 23 req 1): each pool becomes an
aggregated model of its own, the connector reaches vLLM, and what cannot work is refused naming
its field."""

from __future__ import annotations

import pytest
import yaml

from hbmserve.core.config import ClusterSpec, ConfigError, load_cluster_spec, parse_cluster_spec
from hbmserve.core.disagg_spec import Role


def _model(engine: str = "sim", **extra) -> dict:
    return {"name": "m", "source": "/weights", "engine": engine, **extra}


def _spec(**model) -> ClusterSpec:
    return parse_cluster_spec({"models": [model]})


def _refused(**model) -> str:
    with pytest.raises(ConfigError) as err:
        _spec(**model)
    return str(err.value)


SHARED = {"kind": "shared-storage", "path": "/tmp/kv"}


def test_each_pool_is_the_model_with_its_own_replicas_parallelism_and_settings():
    spec = _spec(**_model("vllm-gpu", engine_settings={"max_model_len": 4096, "max_num_seqs": 32},
                          disaggregation={"prefill": {"replicas": 2, "parallelism": {"tp": 4}},
                                          "decode": {"autoscaling": {"min_replicas": 2, "max_replicas": 8},
                                                     "parallelism": {"tp": 8}, "max_replicas_per_node": 1,
                                                     "engine_settings": {"max_model_len": 4096,
                                                                         "max_num_seqs": 256}},
                                          "connector": "nixl"}))
    m = spec.models[0]
    prefill, decode = m.pool(Role.PREFILL), m.pool(Role.DECODE)
    assert (prefill.replicas, prefill.autoscaling, prefill.parallelism.tp) == (2, None, 4)
    assert (decode.autoscaling.max_replicas, decode.parallelism.tp, decode.max_replicas_per_node) == (8, 8, 1)
    assert (prefill.engine_settings.max_num_seqs, decode.engine_settings.max_num_seqs) == (32, 256)
    # vLLM gets the connector on both sides; the door decides which phase runs where.
    for pool in (prefill, decode):
        assert pool.disaggregation is None and pool.name == "m"
        assert pool.engine_settings.vllm_args["kv_transfer_config"] == {"kv_connector": "NixlConnector",
                                                                        "kv_role": "kv_both"}
    # Read back from JSON (as a replica or a door reads it), the spec is the same.
    assert ClusterSpec.model_validate_json(spec.model_dump_json()) == spec


def test_the_cpu_connector_names_its_folder_and_the_simulated_one_its_link():
    cpu = _spec(**_model("vllm-cpu", disaggregation={"connector": SHARED})).models[0]
    assert cpu.pool(Role.DECODE).engine_settings.vllm_args["kv_transfer_config"] == {
        "kv_connector": "ExampleConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": "/tmp/kv"}}
    sim = _spec(**_model(disaggregation={"connector": {"kind": "sim", "link": "infiniband"}})).models[0]
    assert sim.pool(Role.DECODE).sim.kv_link == "infiniband"
    assert sim.pool(Role.DECODE).engine_settings.vllm_args == {}


def test_a_relative_storage_folder_is_resolved_against_the_config_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"models": [_model("vllm-cpu", disaggregation={
        "connector": {"kind": "shared-storage", "path": "kv"}})]}))
    assert load_cluster_spec(path).models[0].disaggregation.connector.path == str(tmp_path / "kv")


@pytest.mark.parametrize("model, names", [
    (_model(disaggregation={"connector": "nixl"}), "disaggregation.connector: nixl does not run with engine sim"),
    (_model("vllm-cpu", disaggregation={"connector": "nixl"}), "nixl moves KV between GPUs and needs engine vllm-gpu"),
    (_model("vllm-gpu", disaggregation={"connector": "sim"}), "sim does not run with engine vllm-gpu"),
    (_model("vllm-cpu", disaggregation={"connector": "shared-storage"}), "disaggregation.connector.path"),
    (_model("vllm-cpu", disaggregation={"connector": {**SHARED, "link": "host"}}), "disaggregation.connector.link"),
    (_model(disaggregation={"connector": {"kind": "sim", "path": "/x"}}), "takes only `link`"),
    (_model(replicas=3, disaggregation={"connector": "sim"}), "replicas: a disaggregated model sets it per pool"),
    (_model(autoscaling={"max_replicas": 2}, disaggregation={"connector": "sim"}), "autoscaling: a disaggregated"),
    (_model(parallelism={"tp": 2}, disaggregation={"connector": "sim"}), "parallelism: a disaggregated"),
    (_model(disaggregation={"connector": "sim", "decode": {"replicas": 0}}),
     "disaggregation.decode: the pool needs at least one replica"),
    (_model("vllm-cpu", disaggregation={"connector": SHARED, "prefill": {"parallelism": {"pp": 2}}}),
     "disaggregation.prefill: parallelism.pp > 1 needs engine vllm-gpu"),
    (_model("vllm-cpu", disaggregation={"connector": SHARED, "decode": {"engine_settings": {"dtype": "float32"}}}),
     "disaggregation.decode.engine_settings.dtype: 'float32' differs from the prefill pool's 'auto'"),
    (_model("vllm-cpu", engine_settings={"vllm_args": {"kv_transfer_config": {"kv_connector": "X"}}},
            disaggregation={"connector": SHARED}), "engine_settings.vllm_args.kv_transfer_config: disaggregation"),
    (_model(adapters=[{"name": "a", "source": "/a"}], disaggregation={"connector": "sim"}),
     "adapters: not with disaggregation yet"),
    (_model(disaggregation={"prefill": {}}), "models.0.disaggregation.connector: Field required"),
    (_model(disaggregation={"connector": "rdma"}), "models.0.disaggregation.connector.kind: Input should be"),
    (_model(disaggregation={"connector": "sim", "middle": {}}), "models.0.disaggregation.middle: unknown field"),
])
def test_what_cannot_work_is_refused_naming_the_field(model, names):
    assert names in _refused(**model)


def test_the_planner_does_not_place_pools_yet(tmp_path):
    topo = tmp_path / "topo.yaml"
    topo.write_text("nodes: []\n")
    with pytest.raises(ConfigError, match="models.0.disaggregation: the placement planner does not place"):
        parse_cluster_spec({"topology": str(topo), "models": [_model("vllm-gpu", disaggregation={
            "connector": "nixl"})]})
