"""The chart isolates the cluster (issue 21, requirement 8), second half: each pod mounts only the
Secret items its config names, the mounted keys hold `sha256:` digests only (checked with the front
door's own parser), and an endpoint Service outside the cluster needs TLS or an explicit opt-in.
Each check comes with mutation checks that show it fail."""

from __future__ import annotations

import copy
import hashlib
import re
import shutil

import pytest
import yaml

from hbmserve.access.keys import KeyRing, authenticate, is_admin, parse_admin_token, parse_keys_file
from tests.chart.chart_support import CHART, HelmFailed, decoded, one, pod_templates, serve_config, validate
from tests.chart.conftest import EXAMPLES

CASES = ["defaults", *EXAMPLES]
DIGEST = re.compile(r"^sha256:[0-9a-fA-F]{64}$")


def _secret_mounts(template: dict) -> dict[str, tuple[str, str | None]]:
    """File in the Ray container -> (Secret, key), for every Secret item it mounts; a volume that
    mounts a whole Secret shows as `<mountPath>/*` with key None."""
    (container,) = template["spec"]["containers"]
    where = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    out = {}
    for volume in template["spec"]["volumes"]:
        if volume["name"] not in where:
            continue
        sources = [volume["secret"]] if "secret" in volume else [
            s["secret"] for s in volume.get("projected", {}).get("sources", []) if "secret" in s]
        for source in sources:
            secret = source.get("secretName") or source.get("name")
            if not source.get("items"):
                out[f"{where[volume['name']]}/*"] = (secret, None)
            for item in source.get("items", []):
                out[f"{where[volume['name']]}/{item['path']}"] = (secret, item["key"])
    return out


def _config_files(docs) -> tuple[str, str | None, str | None]:
    """The Secret-backed files the config names: internal token, keys file, admin token file."""
    args = serve_config(docs)["applications"][0]["args"]
    auth = args["cluster"]["serve"].get("auth") or {}
    return args["internal_token_file"], auth.get("keys_file"), auth.get("admin_token_file")


def _mount_problems(docs) -> list[str]:
    """Secret items a pod mounts that its config does not name (or the reverse), and mounted keys or
    admin tokens in raw form, where the chart wrote the Secret."""
    internal, keys_file, admin_file = _config_files(docs)
    needed = {f for f in (internal, keys_file, admin_file) if f}
    secrets = {d["metadata"]["name"]: decoded(d) for d in docs if d["kind"] == "Secret"}
    problems = []
    for group, template in pod_templates(docs):
        mounts = _secret_mounts(template)
        for path, (secret, key) in sorted(mounts.items()):
            if key is None:
                problems.append(f"{group}: mounts every item of Secret {secret} at {path[:-2]}")
            elif path not in needed:
                problems.append(f"{group}: mounts {secret}/{key}, which its config does not name")
        problems += [f"{group}: {path} is named by the config but not mounted" for path in sorted(needed - set(mounts))]
        if keys_file in mounts and mounts[keys_file][0] in secrets:
            secret, key = mounts[keys_file]
            tenants = yaml.safe_load(secrets[secret][key])["tenants"]
            raw = [f"{t['name']}" for t in tenants for k in t["keys"] if not DIGEST.match(k)]
            problems += [f"{group}: {keys_file} holds a raw key of tenant {name}" for name in raw]
        if admin_file in mounts and mounts[admin_file][0] in secrets:
            secret, key = mounts[admin_file]
            if not DIGEST.match(secrets[secret][key].strip()):
                problems.append(f"{group}: {admin_file} holds the raw admin token")
    return problems


@pytest.mark.parametrize("name", CASES)
def test_each_pod_mounts_only_the_secret_items_its_config_names(rendered, name):
    """Every Ray pod needs the same items: each runs a front door (one per node, reading the keys and
    the admin token) and may build a Serve application (which checks the keys and reads the internal
    token). The raw default key and raw admin token stay in the Secret."""
    docs = rendered[name]
    assert _mount_problems(docs) == []
    secret = one(docs, "Secret", "-api-keys")
    for _, template in pod_templates(docs):
        keys = {key for s, key in _secret_mounts(template).values() if s == secret["metadata"]["name"]}
        assert keys == {"keys.yaml", "admin_token.sha256"}
        assert not keys & {"default_key", "admin_token"}


def _mounted(docs, path: str) -> str:
    secret, key = _secret_mounts(pod_templates(docs)[1][1])[path]
    return decoded(one(docs, "Secret", secret))[key]


def test_the_mounted_digests_admit_the_keys_the_secret_shows(rendered):
    """The front door's own parser reads the mounted files, and the raw key and token from the
    Secret (what NOTES.txt tells users to read, what Prometheus presents) are accepted."""
    docs = rendered["defaults"]
    _, keys_file, admin_file = _config_files(docs)
    raw = decoded(one(docs, "Secret", "-api-keys"))
    ring = parse_keys_file(_mounted(docs, keys_file), keys_file)
    ring = KeyRing(ring.tenants, ring.keys, parse_admin_token(_mounted(docs, admin_file), admin_file))
    assert authenticate(ring, f"Bearer {raw['default_key']}").name == "default"
    assert authenticate(ring, f"Bearer {raw['default_key']}x") is None
    assert is_admin(ring, f"Bearer {raw['admin_token']}")
    assert _mounted(docs, admin_file) == "sha256:" + hashlib.sha256(raw["admin_token"].encode()).hexdigest()


def test_tenant_keys_given_raw_are_stored_as_digests(helm):
    raw_key = "sk-team-a-0123456789abcdef"
    digest = "sha256:" + hashlib.sha256(b"sk-team-b-0123456789abcdef").hexdigest()
    docs = helm.template(values={"auth": {"tenants": [
        {"name": "team-a", "keys": [raw_key], "priority": 2, "tokens_per_minute": 20000},
        {"name": "team-b", "keys": [digest]}]}})
    assert _mount_problems(docs) == []
    _, keys_file, _ = _config_files(docs)
    text = _mounted(docs, keys_file)
    assert raw_key not in text and digest in text
    ring = parse_keys_file(text, keys_file)
    tenant = authenticate(ring, f"Bearer {raw_key}")
    assert (tenant.name, tenant.priority, tenant.tokens_per_minute) == ("team-a", 2, 20000)
    assert authenticate(ring, "Bearer sk-team-b-0123456789abcdef").name == "team-b"
    assert "default_key" not in decoded(one(docs, "Secret", "-api-keys"))


@pytest.mark.parametrize("key", ["sk-short", "sk has spaces 0123456789", "sha256:abc123", "sha256:" + "g" * 64])
def test_a_key_the_front_door_would_refuse_is_refused_without_showing_it(helm, key):
    with pytest.raises(HelmFailed, match=re.escape("auth.tenants[0].keys[0]: a")) as err:
        helm.template(values={"auth": {"tenants": [{"name": "a", "keys": [key]}]}})
    assert key not in str(err.value)


def _whole_secret_on_a_worker(docs):
    volume = next(v for v in pod_templates(docs)[1][1]["spec"]["volumes"] if v["name"] == "api-keys")
    del volume["secret"]["items"]


def _raw_admin_token_mounted(docs):
    volume = next(v for v in pod_templates(docs)[0][1]["spec"]["volumes"] if v["name"] == "api-keys")
    volume["secret"]["items"][1]["key"] = "admin_token"


def _raw_key_in_the_keys_file(docs):
    import base64

    secret = one(docs, "Secret", "-api-keys")
    text = yaml.safe_dump({"tenants": [{"name": "default", "keys": ["sk-a-raw-key-0123456789"]}]})
    secret["data"]["keys.yaml"] = base64.b64encode(text.encode()).decode()


def _internal_token_not_mounted(docs):
    container = pod_templates(docs)[0][1]["spec"]["containers"][0]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "internal-token"]


@pytest.mark.parametrize(("mutate", "problem"), [
    (_whole_secret_on_a_worker, "cpu: mounts every item of Secret demo-hbmserve-api-keys at /etc/hbmserve/auth"),
    (_raw_admin_token_mounted, "head: /etc/hbmserve/auth/admin_token.sha256 holds the raw admin token"),
    (_raw_key_in_the_keys_file, "head: /etc/hbmserve/auth/keys.yaml holds a raw key of tenant default"),
    (_internal_token_not_mounted, "head: /etc/hbmserve/internal/token is named by the config but not mounted"),
])
def test_the_mount_check_reports_a_secret_mounted_too_wide_or_raw(rendered, mutate, problem):
    docs = copy.deepcopy(rendered["defaults"])
    mutate(docs)
    assert problem in _mount_problems(docs)


@pytest.mark.parametrize(("auth", "items"), [
    ({"existingSecret": "team-keys"}, {"keys.yaml", "admin_token"}),  # a Secret made for the older chart
    ({"existingSecret": "team-keys", "adminTokenFileKey": "admin_token.sha256"}, {"keys.yaml", "admin_token.sha256"}),
    ({"existingSecret": "team-keys", "adminToken": {"enabled": False}}, {"keys.yaml"}),
])
def test_an_existing_secret_mounts_the_items_it_must_hold(helm, auth, items):
    docs = helm.template(values={"auth": auth})
    assert _mount_problems(docs) == []
    for _, template in pod_templates(docs):
        assert {k for s, k in _secret_mounts(template).values() if s == "team-keys"} == items


def test_the_admin_token_and_its_digest_need_two_keys(helm):
    with pytest.raises(HelmFailed, match="auth.adminTokenFileKey equals auth.adminTokenKey"):
        helm.template(values={"auth": {"adminTokenFileKey": "admin_token"}})


@pytest.mark.parametrize(("service", "says"), [
    ({"type": "LoadBalancer"}, "service.type is LoadBalancer, which takes API keys and prompts from outside the "
                               "cluster in clear text"),
    ({"type": "NodePort"}, "or set service.exposeWithoutTLS: true to mean it"),
    ({"type": "LoadBalancer"}, "set service.tls.terminatedByLoadBalancer: true"),
    ({"type": "LoadBalancer", "tls": {"terminatedByLoadBalancer": True}},
     "service.tls.terminatedByLoadBalancer is true but service.annotations is empty"),
])
def test_an_endpoint_outside_the_cluster_needs_tls_or_an_explicit_opt_in(helm, service, says):
    with pytest.raises(HelmFailed, match=re.escape(says)):
        helm.template(values={"service": service})


@pytest.mark.parametrize("service", [
    {"type": "LoadBalancer", "tls": {"terminatedByLoadBalancer": True},
     "annotations": {"service.beta.kubernetes.io/aws-load-balancer-ssl-cert": "arn:aws:acm:region:1:certificate/x"}},
    {"type": "NodePort", "tls": {"terminatedByLoadBalancer": True}},  # a load balancer of yours in front
    {"type": "LoadBalancer", "exposeWithoutTLS": True},
])
def test_tls_at_the_load_balancer_or_the_opt_in_lets_the_endpoint_out(helm, schemas, service):
    endpoint = one(helm.template(values={"service": service}), "Service", "-hbmserve")
    assert endpoint["spec"]["type"] == service["type"]
    validate(endpoint)


def test_the_refusal_is_the_charts_guard(helm, tmp_path):
    """Mutation: a copy of the chart without the guard renders a plain LoadBalancer, so the refusal
    tested above comes from that guard and nothing else."""
    chart = tmp_path / "hbmserve"
    shutil.copytree(CHART, chart)
    template = chart / "templates" / "rayservice.yaml"
    text = template.read_text()
    start = text.index("{{- if and (ne $svc.type \"ClusterIP\")")
    end = text.index("{{- end }}\n{{- end }}\n", start) + len("{{- end }}\n{{- end }}\n")
    template.write_text(text[:start] + text[end:])
    endpoint = one(helm.template(values={"service": {"type": "LoadBalancer"}}, chart=chart), "Service", "-hbmserve")
    assert endpoint["spec"]["type"] == "LoadBalancer"
