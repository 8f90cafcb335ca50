"""The chart isolates the cluster (issue 21, requirement 8), first half: the NetworkPolicy and the
ServiceAccount. Each part has a check that lists what is wrong in rendered objects, a test that the
defaults and every example give an empty list, and mutation checks that the same function reports
the fault when the chart is switched or edited into it. (Secret mounts and the endpoint's TLS:
test_chart_secret_mounts.py.)"""

from __future__ import annotations

import copy
from pathlib import PurePosixPath

import pytest

from hbmserve.core.config import parse_cluster_spec
from tests.chart.chart_support import NAMESPACE, one, pod_templates, ray_cluster, serve_config, validate
from tests.chart.conftest import EXAMPLES
from tests.chart.network_policy import Peer, admits

CASES = ["defaults", *EXAMPLES]
DASHBOARD_PORT = 8265  # the head's containerPort `dashboard`, where the KubeRay operator calls


@pytest.fixture(scope="module")
def ray_ports() -> dict[int, str]:
    """Ports a Ray node listens on that no containerPort names, from `ray start`'s own defaults: the
    worker port range's ends and the dashboard agent; plus an ephemeral port, as the raylet, the
    object manager and each replica's HTTP listener take."""
    from ray.scripts.scripts import start

    defaults = {p.name: p.default for p in start.params}
    return {defaults["min_worker_port"]: "lowest Ray worker port", defaults["max_worker_port"]: "highest Ray worker port",
            defaults["dashboard_agent_listen_port"]: "dashboard agent", 45678: "ephemeral: raylet, replica listener"}


def _release_labels(docs) -> dict[str, str]:
    _, worker = pod_templates(docs)[1]
    return {k: v for k, v in worker["metadata"]["labels"].items() if k.startswith("app.kubernetes.io/")}


def _peers(docs) -> dict[str, Peer]:
    labels = _release_labels(docs)
    return {
        "release": Peer("a pod of this release", "10.0.0.11", NAMESPACE, labels),
        "other-release": Peer("a pod of another release", "10.0.0.12", NAMESPACE,
                              {**labels, "app.kubernetes.io/instance": "other"}),
        "client-pod": Peer("a pod in another namespace", "10.0.1.5", "apps", {"app": "client"}),
        # Labels are anyone's to set: the release's own, on a pod elsewhere, must not be enough.
        "look-alike": Peer("a pod with the release's labels in another namespace", "10.0.1.6", "apps", labels),
        "outside": Peer("an address outside the cluster", "203.0.113.7"),
        "ingress": Peer("the ingress controller", "10.0.4.4", "ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"}),
        "operator": Peer("the KubeRay operator", "10.0.2.3", "kuberay-system",
                         {"app.kubernetes.io/name": "kuberay-operator", "app.kubernetes.io/component": "kuberay-operator"}),
        "prometheus": Peer("Prometheus", "10.0.3.4", "monitoring", {"app.kubernetes.io/name": "prometheus"}),
    }


def _intent(serve_from: set[str] | None = None, dashboard_from_anyone: bool = False):
    """Who should reach which port: every port from this release's pods; the front doors' port from
    `serve_from` (None: anyone); the dashboard from the operator; the metrics port from Prometheus."""
    def may(peer: str, what: str) -> bool:
        if peer == "release":
            return True
        if what == "serve":
            return serve_from is None or peer in serve_from
        if what == "dashboard":
            return peer == "operator" or dashboard_from_anyone
        return what == "metrics" and peer == "prometheus"
    return may


def _reach_problems(docs, ray_ports: dict[int, str], may=None) -> list[str]:
    """Each (pod, peer, port) where what the rendered NetworkPolicies admit differs from `may`."""
    may = may or _intent()
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    problems = []
    for group, template in pod_templates(docs):
        (container,) = template["spec"]["containers"]
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        probes = {port: name for name, port in named.items()} | ray_ports
        for key, peer in _peers(docs).items():
            for port, what in sorted(probes.items()):
                got = admits(policies, NAMESPACE, template["metadata"]["labels"], named, peer, port)
                if got != may(key, what):
                    problems.append(f"{group}: {peer.name} {'reaches' if got else 'is refused'} {port} ({what})")
    return problems


@pytest.mark.parametrize("name", CASES)
def test_the_network_policy_admits_each_peer_to_its_ports_only(rendered, ray_ports, name):
    docs = rendered[name]
    policy = one(docs, "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress stays open: weights, the API server
    assert _reach_problems(docs, ray_ports) == []


@pytest.mark.parametrize(("values", "problem"), [
    ({"networkPolicy": {"enabled": False}}, "head: an address outside the cluster reaches 6379 (gcs-server)"),
    ({"networkPolicy": {"enabled": False}}, "cpu: a pod of another release reaches 45678 (ephemeral: raylet, replica listener)"),
    ({"networkPolicy": {"extraIngress": [{"ports": [{"port": 10001}]}]}},
     "head: a pod in another namespace reaches 10001 (client)"),
    ({"networkPolicy": {"extraIngress": [{"ports": [{"port": 10002, "endPort": 19999}]}]}},
     "cpu: an address outside the cluster reaches 10002 (lowest Ray worker port)"),
    ({"networkPolicy": {"metrics": {"from": []}}}, "cpu: Prometheus is refused 8080 (metrics)"),
    ({"networkPolicy": {"kuberayOperator": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
                                            "podSelector": {}}}},
     "head: the KubeRay operator is refused 8265 (dashboard)"),
])
def test_the_reach_check_reports_a_policy_that_is_missing_or_wrong(helm, ray_ports, values, problem):
    assert problem in _reach_problems(helm.template(values=values), ray_ports)


def test_a_policy_selecting_other_pods_isolates_nothing(rendered, ray_ports):
    docs = copy.deepcopy(rendered["defaults"])
    one(docs, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] = "typo"
    assert "head: a pod in another namespace reaches 6379 (gcs-server)" in _reach_problems(docs, ray_ports)


def test_release_labels_from_another_namespace_are_not_the_release(rendered, ray_ports):
    """Mutation: the release-pods rule given `namespaceSelector: {}` would let any namespace in."""
    docs = copy.deepcopy(rendered["defaults"])
    one(docs, "NetworkPolicy")["spec"]["ingress"][0]["from"][0]["namespaceSelector"] = {}
    assert ("head: a pod with the release's labels in another namespace reaches 6379 (gcs-server)"
            in _reach_problems(docs, ray_ports))


@pytest.mark.parametrize(("values", "may"), [
    ({"networkPolicy": {"serve": {"from": [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "ingress-nginx"}}}]}}}, _intent(serve_from={"ingress"})),
    ({"dashboard": {"exposeOutsideCluster": True, "service": {"type": "LoadBalancer"}}}, _intent(dashboard_from_anyone=True)),
])
def test_peers_are_set_by_values(helm, schemas, ray_ports, values, may):
    docs = helm.template(values=values)
    assert _reach_problems(docs, ray_ports, may) == []
    validate(one(docs, "NetworkPolicy"))


@pytest.mark.parametrize(("rule", "peer", "port", "admitted"), [
    ({"from": [{"podSelector": {}}]}, Peer("same namespace", "10.0.0.2", NAMESPACE), 1, True),
    ({"from": [{"podSelector": {}}]}, Peer("other namespace", "10.0.0.2", "apps"), 1, False),
    ({"from": [{"namespaceSelector": {}}]}, Peer("other namespace", "10.0.0.2", "apps"), 1, True),
    ({"from": [{"namespaceSelector": {}}]}, Peer("outside", "198.51.100.1"), 1, False),
    ({"from": [{"ipBlock": {"cidr": "198.51.100.0/24", "except": ["198.51.100.0/28"]}}]}, Peer("o", "198.51.100.1"), 1, False),
    ({"from": [{"ipBlock": {"cidr": "198.51.100.0/24"}}]}, Peer("outside", "198.51.100.1"), 1, True),
    ({"from": []}, Peer("outside", "198.51.100.1"), 1, True),
    ({"ports": [{"port": "serve"}]}, Peer("outside", "198.51.100.1"), 8000, True),
    ({"ports": [{"port": 10002, "endPort": 19999}]}, Peer("outside", "198.51.100.1"), 20000, False),
    ({"ports": [{"port": 8000, "protocol": "UDP"}]}, Peer("outside", "198.51.100.1"), 8000, False),
    ({"from": [{"podSelector": {"matchExpressions": [{"key": "a", "operator": "In", "values": ["x"]}]}}]},
     Peer("labelled", "10.0.0.2", NAMESPACE, {"a": "y"}), 1, False),
])
def test_the_policy_model_follows_the_api_rules(rule, peer, port, admitted):
    policy = {"kind": "NetworkPolicy", "metadata": {}, "spec": {"podSelector": {}, "ingress": [rule]}}
    assert admits([policy], NAMESPACE, {"app": "x"}, {"serve": 8000}, peer, port) is admitted
    assert admits([], NAMESPACE, {"app": "x"}, {}, peer, port) is True  # no policy: not isolated


def _api_dir() -> str:
    """Where Ray's KubeRay node provider (the autoscaler) reads its token and CA certificate."""
    from ray.autoscaler._private.kuberay.node_provider import IN_CLUSTER_CA_CERT_PATH, IN_CLUSTER_TOKEN_PATH

    (folder,) = {str(PurePosixPath(p).parent) for p in (IN_CLUSTER_TOKEN_PATH, IN_CLUSTER_CA_CERT_PATH)}
    return folder


def _token_files(volume: dict) -> set[str]:
    """Files a projected volume holds that are an API credential: the token and the CA certificate."""
    files = set()
    for source in volume.get("projected", {}).get("sources", []):
        if "serviceAccountToken" in source:
            files.add(source["serviceAccountToken"]["path"])
        if source.get("configMap", {}).get("name") == "kube-root-ca.crt":
            files |= {i["path"] for i in source["configMap"].get("items", [])}
    return files


def _account_problems(docs) -> list[str]:
    """What breaks "every pod runs as the release's own account and only the autoscaler holds a token"."""
    api_dir = _api_dir()
    accounts = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceAccount"}
    problems = [f"ServiceAccount {n} automounts its token" for n, a in accounts.items()
                if a.get("automountServiceAccountToken") is not False]
    cluster = ray_cluster(docs)
    autoscaler = cluster.get("autoscalerOptions", {}) if cluster.get("enableInTreeAutoscaling") else None
    for group, template in pod_templates(docs):
        spec = template["spec"]
        account = spec.get("serviceAccountName", "default")
        if account not in accounts:
            problems.append(f"{group}: runs as {account}, not an account of the release")
        if spec.get("automountServiceAccountToken") is not False:
            problems.append(f"{group}: mounts its account's token into every container")
        for c in spec["containers"] + spec.get("initContainers", []):
            if any(m["mountPath"].startswith(api_dir) for m in c.get("volumeMounts", [])):
                problems.append(f"{group}: container {c['name']} holds an API token")
        token_volumes = {v["name"]: _token_files(v) for v in spec["volumes"] if _token_files(v)}
        sidecar = {m["name"]: m["mountPath"] for m in (autoscaler or {}).get("volumeMounts", [])} if group == "head" else {}
        for volume in set(token_volumes) - set(sidecar):
            problems.append(f"{group}: volume {volume} holds an API token no autoscaler uses")
        if group == "head" and autoscaler is not None:
            reachable = {f for v, files in token_volumes.items() if sidecar.get(v) == api_dir for f in files}
            if not {"token", "ca.crt"} <= reachable:
                problems.append(f"head: the autoscaler finds no token and CA certificate in {api_dir}")
    return problems


@pytest.mark.parametrize("name", CASES)
def test_every_pod_runs_as_the_releases_account_and_only_the_autoscaler_holds_a_token(rendered, name):
    docs = rendered[name]
    assert _account_problems(docs) == []
    account = one(docs, "ServiceAccount")["metadata"]["name"]
    assert account != "default" and {t["spec"]["serviceAccountName"] for _, t in pod_templates(docs)} == {account}


def _automount_on_a_worker(docs):
    pod_templates(docs)[1][1]["spec"]["automountServiceAccountToken"] = True


def _autoscaler_without_its_token(docs):
    del ray_cluster(docs)["autoscalerOptions"]["volumeMounts"]


def _token_in_the_ray_container(docs):
    head = pod_templates(docs)[0][1]["spec"]["containers"][0]
    head["volumeMounts"].append({"name": "autoscaler-api-token", "mountPath": _api_dir()})


@pytest.mark.parametrize(("mutate", "problem"), [
    (_automount_on_a_worker, "cpu: mounts its account's token into every container"),
    (_autoscaler_without_its_token, "head: volume autoscaler-api-token holds an API token no autoscaler uses"),
    (_autoscaler_without_its_token, "head: the autoscaler finds no token and CA certificate in /var/run/secrets/"
                                    "kubernetes.io/serviceaccount"),
    (_token_in_the_ray_container, "head: container ray-head holds an API token"),
])
def test_the_account_check_reports_a_token_where_it_should_not_be(rendered, mutate, problem):
    docs = copy.deepcopy(rendered["defaults"])
    mutate(docs)
    assert problem in _account_problems(docs)


def test_the_account_check_reports_the_namespaces_default_account(helm):
    docs = helm.template(values={"serviceAccount": {"create": False, "name": "default"}})
    assert {"head: runs as default, not an account of the release",
            "cpu: runs as default, not an account of the release"} <= set(_account_problems(docs))


def test_without_the_autoscaler_no_pod_holds_a_token(helm):
    docs = helm.template(values={"autoscaler": {"enabled": False}})
    assert _account_problems(docs) == []
    assert not [v for _, t in pod_templates(docs) for v in t["spec"]["volumes"] if _token_files(v)]


def test_an_existing_account_must_be_named(helm):
    from tests.chart.chart_support import HelmFailed

    with pytest.raises(HelmFailed, match="serviceAccount.create is false: set serviceAccount.name"):
        helm.template(values={"serviceAccount": {"create": False}})
    docs = helm.template(values={"serviceAccount": {"create": False, "name": "team-sa"}})
    assert not [d for d in docs if d["kind"] == "ServiceAccount"]
    assert {t["spec"]["serviceAccountName"] for _, t in pod_templates(docs)} == {"team-sa"}


def test_the_serve_port_in_the_policy_follows_the_config(helm, ray_ports):
    docs = helm.template(values={"cluster": {"serve": {"http": {"host": "0.0.0.0", "port": 9000}},
                                             "models": [{"name": "m", "source": "/m", "engine": "sim"}]}})
    assert parse_cluster_spec(serve_config(docs)["applications"][0]["args"]["cluster"]).serve.http.port == 9000
    assert _reach_problems(docs, ray_ports) == []
