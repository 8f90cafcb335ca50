"""Bad values are refused before anything is installed, each with a message naming the value; the
optional parts render and validate when switched on; every value is documented for helm-docs."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.chart.chart_support import CHART, DATA, ROOT, HelmFailed, one, validate


def test_a_bad_values_file_is_rejected_naming_each_bad_value(helm):
    values = yaml.safe_load((DATA / "bad-values.yaml").read_text())
    with pytest.raises(HelmFailed) as err:
        helm.template(DATA / "bad-values.yaml")
    message = str(err.value)
    assert "values don't meet the specifications of the schema" in message
    assert "at '/cluster/models/0/parallelism/tp': minimum: got 0, want 1" in message
    assert "at '/cluster/models/0/engine': value must be one of 'vllm-gpu', 'vllm-cpu', 'sim'" in message
    assert "at '/workerGroups/0/gpus': got string, want integer" in message
    report = helm.lint(values)
    assert not report["passed"]
    assert any("/cluster/models/0/parallelism/tp" in m["message"] for m in report["messages"] if m["severity"] == "ERROR")


@pytest.mark.parametrize(("values", "says"), [
    ({"cluster": {"serve": {"auth": {"keys_file": "/k"}}}}, "at '/cluster/serve': additional properties 'auth' not allowed"),
    ({"cluster": {"topology": "/t.yaml"}}, "at '/cluster': additional properties 'topology' not allowed"),
    ({"workerGroups": []}, "at '/workerGroups': minItems: got 0, want 1"),
    ({"workerGroups": [{"name": "GPU_A", "replicas": 1, "minReplicas": 1, "maxReplicas": 1}]},
     "at '/workerGroups/0/name'"),
    ({"weightCache": {"type": "nfs"}}, "at '/weightCache/type': value must be one of"),
    ({"ray": {"version": "2.40.0"}}, "at '/ray/version'"),
    ({"upgradeStrategy": "Replace"}, "at '/upgradeStrategy': value must be one of"),
])
def test_the_schema_names_the_value_at_fault(helm, values, says):
    with pytest.raises(HelmFailed, match=re.escape(says)):
        helm.template(values=values)


@pytest.mark.parametrize(("values", "says"), [
    ({"dashboard": {"service": {"type": "LoadBalancer"}}}, "set dashboard.exposeOutsideCluster: true"),
    ({"workerGroups": [{"name": "a", "replicas": 3, "minReplicas": 1, "maxReplicas": 2}]},
     "workerGroups[0] (a): need minReplicas <= replicas <= maxReplicas, got 1 <= 3 <= 2"),
    ({"workerGroups": [{"name": "a", "replicas": 1, "minReplicas": 1, "maxReplicas": 1},
                       {"name": "a", "replicas": 1, "minReplicas": 1, "maxReplicas": 1}]},
     "workerGroups[1].name: a is used by another group"),
    ({"workerGroups": [{"name": "a", "topologyNode": "box", "replicas": 1, "minReplicas": 1, "maxReplicas": 4}]},
     "topologyNode box is one machine"),
    ({"weightCache": {"enabled": True, "type": "persistentVolumeClaim"}},
     "weightCache.persistentVolumeClaim.claimName is required"),
])
def test_what_the_schema_cannot_say_the_templates_refuse_clearly(helm, values, says):
    with pytest.raises(HelmFailed, match=re.escape(says)):
        helm.template(values=values)


def test_exposing_the_dashboard_takes_an_explicit_value(helm):
    docs = helm.template(values={"dashboard": {"exposeOutsideCluster": True, "service": {"type": "LoadBalancer"}}})
    assert one(docs, "Service", "-dashboard")["spec"]["type"] == "LoadBalancer"


def test_ingress_and_service_monitor_render_valid_objects_when_on(helm, schemas):
    docs = helm.template(values={
        "ingress": {"enabled": True, "className": "nginx",
                    "tls": [{"secretName": "tls", "hosts": ["llm.example.com"]}],
                    "hosts": [{"host": "llm.example.com", "paths": [{"path": "/", "pathType": "Prefix"}]}]},
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}})
    ingress = one(docs, "Ingress")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": one(docs, "Service", "-hbmserve")["metadata"]["name"], "port": {"name": "http"}}
    monitor = one(docs, "ServiceMonitor")
    metrics = one(docs, "Service", "-metrics")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= metrics["metadata"]["labels"].items()
    assert metrics["spec"]["clusterIP"] == "None" and metrics["spec"]["ports"][0]["targetPort"] == "metrics"
    # The front doors' /metrics too, with the admin token from the chart's Secret.
    assert metrics["spec"]["ports"][1] == {"name": "door-metrics", "port": 8000, "targetPort": "serve", "protocol": "TCP"}
    doors = monitor["spec"]["endpoints"][1]
    secret = one(docs, "Secret", "-api-keys")
    assert doors["port"] == "door-metrics" and doors["path"] == "/metrics"
    assert doors["authorization"] == {"type": "Bearer", "credentials": {"name": secret["metadata"]["name"],
                                                                        "key": "admin_token"}}
    assert "admin_token" in secret["data"]
    # Without an admin token the doors refuse /metrics: only Ray's port is scraped.
    no_admin = helm.template(values={"metrics": {"serviceMonitor": {"enabled": True}},
                                     "auth": {"adminToken": {"enabled": False}}})
    assert [e["port"] for e in one(no_admin, "ServiceMonitor")["spec"]["endpoints"]] == ["metrics"]
    for doc in docs:
        validate(doc)


def test_auth_off_leaves_the_config_without_keys(helm):
    docs = helm.template(values={"auth": {"enabled": False}})
    from tests.chart.chart_support import serve_config

    assert "auth" not in serve_config(docs)["applications"][0]["args"]["cluster"]["serve"]
    assert not [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"].endswith("-api-keys")]


def _undocumented(lines: list[str]) -> list[str]:
    """Keys of values.yaml with no `# --` comment on them or on a key above them (helm-docs reads those)."""
    missing, documented = [], []  # documented: indents of the open keys that carry a comment
    for i, line in enumerate(lines):
        m = re.match(r"^( *)([A-Za-z][\w.-]*):", line)
        if not m:
            continue
        indent = len(m.group(1))
        documented = [d for d in documented if d < indent]
        comments = []  # the comment block right above the key
        for j in range(i - 1, -1, -1):
            if not lines[j].strip().startswith("#"):
                break
            comments.append(lines[j].strip())
        has = any(c.startswith("# --") for c in comments)
        if has:
            documented.append(indent)
        elif not documented and not _has_children(lines, i, indent):
            missing.append(m.group(2))
    return missing


def _has_children(lines: list[str], i: int, indent: int) -> bool:
    nxt = next((line for line in lines[i + 1:] if line.strip() and not line.strip().startswith("#")), "")
    return len(nxt) - len(nxt.lstrip()) > indent and not nxt.lstrip().startswith("- ")


def test_every_value_is_documented_for_helm_docs():
    lines = (CHART / "values.yaml").read_text().splitlines()
    assert _undocumented(lines) == []
    assert _undocumented(["a:", "  b: 1", "# -- doc", "c: 2"]) == ["b"]


def test_the_grafana_dashboard_is_off_by_default_and_ships_ops_json_when_on(helm, rendered, schemas):
    """The ConfigMap carries ops/grafana/hbmserve.json byte for byte (the dashboard whose queries
    test_metrics_live.py runs against a real Prometheus), labelled for Grafana's sidecar."""
    assert not [d for d in rendered["defaults"] if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-grafana")]
    docs = helm.template(values={"grafanaDashboard": {"enabled": True, "folder": "LLM serving"}})
    config_map = one(docs, "ConfigMap", "-grafana")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "LLM serving"}
    shipped = ROOT / "ops" / "grafana" / "hbmserve.json"
    assert config_map["data"]["hbmserve.json"] == shipped.read_text()
    assert json.loads(config_map["data"]["hbmserve.json"])["uid"] == "hbmserve"
    validate(config_map)
    relabelled = helm.template(values={"grafanaDashboard": {"enabled": True, "labels": {"dashboards": "hbm"}}})
    assert one(relabelled, "ConfigMap", "-grafana")["metadata"]["labels"]["dashboards"] == "hbm"


def test_a_disaggregated_models_pools_run_on_their_own_worker_groups(helm, rendered):
    """The example: each pool's ray_resources is what only its group offers; the serve config
    deploys both pools of the model; a pool resource no group offers is refused naming it."""
    from hbmserve.core.config import parse_cluster_spec

    docs = rendered["h100-70b-disaggregated"]
    service = one(docs, "RayService")
    groups = {g["groupName"]: g for g in service["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    offered = {name: json.loads(json.loads(g["rayStartParams"]["resources"])) for name, g in groups.items()}
    assert offered == {"prefill": {"hbmserve-prefill": 2}, "decode": {"hbmserve-decode": 1}}
    assert (groups["decode"]["minReplicas"], groups["decode"]["maxReplicas"]) == (2, 4)
    serve = yaml.safe_load(service["spec"]["serveConfigV2"])
    (model_app,) = [a for a in serve["applications"] if a["args"].get("model")]
    model = parse_cluster_spec(model_app["args"]["cluster"]).models[0]
    assert model.disaggregation.prefill.ray_resources == {"hbmserve-prefill": 1}
    assert model.disaggregation.decode.ray_resources == {"hbmserve-decode": 1}
    values = yaml.safe_load((ROOT / "helm" / "examples" / "h100-70b-disaggregated.yaml").read_text())
    values["cluster"]["models"][0]["disaggregation"]["decode"]["ray_resources"] = {"hbmserve-decoder": 1}
    with pytest.raises(HelmFailed, match=re.escape("cluster.models[0].disaggregation.decode.ray_resources: "
                                                   "hbmserve-decoder is on no worker group")):
        helm.template(values=values)
