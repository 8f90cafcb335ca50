"""What the rendered objects must say: GPU limits, the node bootstrap's Ray labels and resources,
volumes, Secrets referenced and never inlined, Ray token authentication on, nothing exposed
outside the cluster by default, hardened pods."""

from __future__ import annotations

import json

import pytest
import yaml

from hbmserve.core.config import parse_cluster_spec
from hbmserve.placement.bootstrap import bootstrap_node
from hbmserve.placement.cluster_file import load_cluster_file
from tests.chart.chart_support import (decoded, one, pod_templates, ray_cluster, ray_containers, secret_data,
                                      serve_config, validate)
from tests.chart.conftest import EXAMPLES

CASES = ["defaults", *EXAMPLES]
GPU_EXAMPLES = ["h100-405b-tp8-pp2", "pcie-nvlink-pairs-tp2"]


def _example_values(name: str) -> dict:
    return yaml.safe_load(EXAMPLES[name].read_text())


def _cluster_spec(docs):
    return parse_cluster_spec(serve_config(docs)["applications"][0]["args"]["cluster"])


def _ray_start_resources(params: dict) -> dict:
    # KubeRay hands the value to `ray start --resources` through a shell: a JSON object in quotes.
    value = params["resources"]
    assert value.startswith('"') and value.endswith('"'), value
    return json.loads(json.loads(value))


@pytest.mark.parametrize("name", GPU_EXAMPLES)
def test_gpu_workers_get_the_gpu_limit_and_rays_num_gpus(rendered, name):
    groups = {g["name"]: g for g in _example_values(name)["workerGroups"]}
    spec = _cluster_spec(rendered[name])
    gpus_needed = sum(m.parallelism.tp * m.parallelism.pp * m.replicas for m in spec.models)
    total = 0
    for g in ray_cluster(rendered[name])["workerGroupSpecs"]:
        (container,) = g["template"]["spec"]["containers"]
        gpus = groups[g["groupName"]]["gpus"]
        assert gpus > 0
        assert container["resources"]["limits"]["nvidia.com/gpu"] == gpus
        assert g["rayStartParams"]["num-gpus"] == str(gpus)
        total += gpus * g["replicas"]
    assert total == gpus_needed  # each example fills its GPUs exactly


@pytest.mark.parametrize("name", ["defaults", "cpu-demo"])
def test_cpu_only_clusters_ask_for_no_gpu(rendered, name):
    for container in ray_containers(rendered[name]):
        assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert all(g["rayStartParams"]["num-gpus"] == "0" for g in ray_cluster(rendered[name])["workerGroupSpecs"])


@pytest.mark.parametrize("name", GPU_EXAMPLES)
def test_each_node_group_carries_its_node_bootstrap_labels_and_resources(rendered, name, tmp_path):
    """The topology ConfigMap is a cluster file hbmserve reads, and each group standing for one of its
    nodes has exactly the Ray labels and NVLink-island resources `hbmserve node-bootstrap` makes."""
    config_map = one(rendered[name], "ConfigMap", "-topology")
    (tmp_path / "cluster.yaml").write_text(config_map["data"]["cluster.yaml"])
    topology = load_cluster_file(tmp_path / "cluster.yaml")
    spec = _cluster_spec(rendered[name])
    assert spec.topology == "/etc/hbmserve/topology/cluster.yaml"
    assert all(spec.plans_placement(m) for m in spec.models)
    groups = ray_cluster(rendered[name])["workerGroupSpecs"]
    assert {g["template"]["metadata"]["annotations"]["hbmserve.io/topology-node"] for g in groups} == \
        {n.name for n in topology.nodes}
    for g in groups:
        expected = bootstrap_node(topology.node(g["template"]["metadata"]["annotations"]["hbmserve.io/topology-node"]))
        assert g["labels"] == dict(expected.labels)
        assert _ray_start_resources(g["rayStartParams"]) == dict(expected.resources)
        assert g["maxReplicas"] == 1  # a group standing for a machine is that one machine


@pytest.mark.parametrize("name", CASES)
def test_ray_token_auth_is_on_everywhere_with_the_token_from_a_secret(rendered, name):
    docs = rendered[name]
    cluster = ray_cluster(docs)
    secret = one(docs, "Secret", "-ray-auth")["metadata"]["name"]
    assert cluster["authOptions"] == {"mode": "token", "secretName": secret}
    token_ref = {"secretKeyRef": {"name": secret, "key": "auth_token"}}
    containers = ray_containers(docs)
    if cluster["enableInTreeAutoscaling"]:
        containers.append(cluster["autoscalerOptions"])
    for c in containers:
        env = {e["name"]: e for e in c["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token"
        assert env["RAY_AUTH_TOKEN"] == {"name": "RAY_AUTH_TOKEN", "valueFrom": token_ref}
    assert len(secret_data(docs, "-ray-auth")["auth_token"]) >= 32


def _leaks(docs) -> list[str]:
    """Where a Secret's value (a token, or an API key inside the keys file) appears outside Secrets."""
    values = [v for d in docs if d["kind"] == "Secret" for v in decoded(d).values()]
    keys = [k for v in values if v.startswith("tenants:") for t in yaml.safe_load(v)["tenants"] for k in t["keys"]]
    secrets = [v for v in values if len(v) >= 16 and not v.startswith("tenants:")] + keys
    assert secrets
    return [f"{d['kind']} {d['metadata']['name']}: {s[:4]}..." for d in docs if d["kind"] != "Secret"
            for s in secrets if s in yaml.safe_dump(d)]


@pytest.mark.parametrize("name", CASES)
def test_secrets_are_referenced_never_inlined(rendered, name):
    assert _leaks(rendered[name]) == []


def test_an_inlined_token_is_caught(rendered):
    docs = json.loads(json.dumps(rendered["defaults"]))
    token = secret_data(docs, "-internal")["token"]
    ray_containers(docs)[0]["env"].append({"name": "LEAK", "value": f"Bearer {token}"})
    assert _leaks(docs) == ["RayService demo-hbmserve: " + token[:4] + "..."]


@pytest.mark.parametrize("name", CASES)
def test_the_config_names_files_where_the_secrets_are_mounted(rendered, name):
    docs = rendered[name]
    spec = _cluster_spec(docs)
    token_file = serve_config(docs)["applications"][0]["args"]["internal_token_file"]
    mounts = {"api-keys": (spec.serve.auth.keys_file, spec.serve.auth.admin_token_file),
              "internal-token": (token_file,)}
    keys_secret = secret_data(docs, "-api-keys")
    assert set(keys_secret) >= {"keys.yaml", "admin_token"}
    assert len(secret_data(docs, "-internal")["token"]) >= 32
    for group, template in pod_templates(docs):
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        (container,) = template["spec"]["containers"]
        mounted = {m["name"]: m for m in container["volumeMounts"]}
        for volume, files in mounts.items():
            secret_name = volumes[volume]["secret"]["secretName"]
            assert secret_name in {d["metadata"]["name"] for d in docs if d["kind"] == "Secret"}
            assert mounted[volume]["readOnly"] is True
            for f in files:
                assert f.startswith(mounted[volume]["mountPath"] + "/"), (group, f)


def test_existing_secrets_replace_the_charts_own(helm, schemas):
    docs = helm.template(values={"auth": {"existingSecret": "team-keys"},
                                 "ray": {"auth": {"existingSecret": "ray-token"}},
                                 "internalToken": {"existingSecret": "front-door-token"}})
    assert not [d for d in docs if d["kind"] == "Secret"]
    assert ray_cluster(docs)["authOptions"]["secretName"] == "ray-token"
    volumes = {v["name"]: v for v in pod_templates(docs)[0][1]["spec"]["volumes"]}
    assert volumes["api-keys"]["secret"]["secretName"] == "team-keys"
    assert volumes["internal-token"]["secret"]["secretName"] == "front-door-token"
    for doc in docs:
        validate(doc)


@pytest.mark.parametrize(("cache", "expect"), [
    ({"type": "hostPath", "hostPath": {"path": "/mnt/nvme0/w"}}, {"hostPath": {"path": "/mnt/nvme0/w",
                                                                               "type": "DirectoryOrCreate"}}),
    ({"type": "ephemeral", "ephemeral": {"storageClassName": "local-nvme", "size": "500Gi"}}, "ephemeral"),
    ({"type": "persistentVolumeClaim", "persistentVolumeClaim": {"claimName": "weights"}},
     {"persistentVolumeClaim": {"claimName": "weights"}}),
    ({"type": "emptyDir", "emptyDir": {"sizeLimit": "100Gi"}}, {"emptyDir": {"sizeLimit": "100Gi"}}),
])
def test_weight_cache_volume_kinds_mount_where_the_cache_expects(helm, schemas, cache, expect):
    docs = helm.template(values={"weightCache": {"enabled": True, "mountPath": "/var/cache/hbmserve/weights", **cache}})
    for group, template in pod_templates(docs):
        volume = next(v for v in template["spec"]["volumes"] if v["name"] == "weight-cache")
        if expect == "ephemeral":
            claim = volume["ephemeral"]["volumeClaimTemplate"]["spec"]
            assert claim["storageClassName"] == "local-nvme" and claim["resources"]["requests"]["storage"] == "500Gi"
        else:
            assert {k: v for k, v in volume.items() if k != "name"} == expect
        (container,) = template["spec"]["containers"]
        assert {"name": "weight-cache", "mountPath": "/var/cache/hbmserve/weights"} in container["volumeMounts"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["HF_HOME"] == "/var/cache/hbmserve/weights/huggingface"
    validate(one(docs, "RayService"))
    # hbmserve's own weight cache (what replicas resolve their model through) lives on the volume.
    for app in serve_config(docs)["applications"]:
        assert app["args"]["cluster"]["cache"]["root"] == "/var/cache/hbmserve/weights"


def test_weight_cache_is_off_by_default(rendered):
    for _, template in pod_templates(rendered["defaults"]):
        assert "weight-cache" not in {v["name"] for v in template["spec"]["volumes"]}
    # Off, the cache still needs a writable place: `~` is on the read-only root filesystem.
    for app in serve_config(rendered["defaults"])["applications"]:
        assert app["args"]["cluster"]["cache"]["root"] == "/tmp/hbmserve-weights"


@pytest.mark.parametrize("name", CASES)
def test_nothing_is_exposed_outside_the_cluster_by_default(rendered, name):
    docs = rendered[name]
    assert all(d["spec"].get("type", "ClusterIP") == "ClusterIP" for d in docs if d["kind"] == "Service")
    assert ray_cluster(docs)["headGroupSpec"]["serviceType"] == "ClusterIP"
    assert not [d for d in docs if d["kind"] == "Ingress"]
    dashboard = one(docs, "Service", "-dashboard")
    assert dashboard["spec"]["selector"]["app.kubernetes.io/component"] == "ray-head"


@pytest.mark.parametrize("name", CASES)
def test_pods_run_as_non_root_on_a_read_only_root_filesystem(rendered, name):
    cluster = ray_cluster(rendered[name])
    for group, template in pod_templates(rendered[name]):
        assert template["spec"]["securityContext"]["runAsNonRoot"] is True, group
        for c in template["spec"]["containers"] + template["spec"].get("initContainers", []):
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, (group, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/tmp"}  # Ray's session files
            assert c["resources"].get("requests"), (group, c["name"])
    if cluster["enableInTreeAutoscaling"]:
        assert cluster["autoscalerOptions"]["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("name", CASES)
def test_disruption_budgets_cover_the_head_and_each_group(rendered, name):
    docs = rendered[name]
    budgets = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    for group, template in pod_templates(docs):
        labels = template["metadata"]["labels"]
        matching = [b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert len(matching) == 1, group
        if group == "head":
            assert matching[0]["spec"]["minAvailable"] == 1
        else:
            g = next(g for g in ray_cluster(docs)["workerGroupSpecs"] if g["groupName"] == group)
            assert matching[0]["spec"]["minAvailable"] == g["minReplicas"]


@pytest.mark.parametrize("name", CASES)
def test_endpoint_service_selects_the_workers_whose_front_door_answers(rendered, name):
    docs = rendered[name]
    selector = one(docs, "Service", "-hbmserve")["spec"]["selector"]
    for group, template in pod_templates(docs):
        selected = selector.items() <= template["metadata"]["labels"].items()
        assert selected == (group != "head"), group
        if group != "head":
            (container,) = template["spec"]["containers"]
            assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "serve"}
    assert one(docs, "RayService")["spec"]["excludeHeadPodFromServeSvc"] is True


@pytest.mark.parametrize("name", CASES)
def test_every_ray_container_runs_serve_replicas_at_normal_priority(rendered, name):
    """Ray's workers default to nice 15, below its daemons: the data path would lose every tie."""
    for c in ray_containers(rendered[name]):
        assert {e["name"]: e.get("value") for e in c["env"]}["RAY_worker_niceness"] == "0"
