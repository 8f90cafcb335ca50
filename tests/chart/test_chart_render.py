"""Every example lints (`helm lint --strict`) and renders (`helm template`) with real Helm; every
rendered object is valid for its kind; the rendered Serve config is the one hbmserve itself writes
for the same cluster config, and Ray Serve accepts it."""

from __future__ import annotations

import json

import pytest
import yaml

from hbmserve.core.config import parse_cluster_spec
from hbmserve.deployments.wire.names import FRONT_DOOR_APP as APP_NAME
from hbmserve.deployments.apps.declarative import FRONT_DOOR_APP_IMPORT, MODEL_APP_IMPORT, BuilderArgs, serve_config
from tests.chart.chart_support import one, pod_templates, ray_cluster, validate
from tests.chart.chart_support import serve_config as rendered_serve_config
from tests.chart.conftest import EXAMPLES
from tests.chart.values_schema import SCHEMA_FILE, generated_defs

CASES = ["defaults", *EXAMPLES]


@pytest.mark.parametrize("name", CASES)
def test_lint_strict_passes_with_nothing_to_report(helm, name):
    values = yaml.safe_load(EXAMPLES[name].read_text()) if name in EXAMPLES else None
    report = helm.lint(values)
    # An INFO about the missing chart icon is all Helm may say; --strict fails on any warning.
    problems = [m for m in report["messages"] if m["severity"] != "INFO"]
    assert report["passed"] and not problems, problems


@pytest.mark.parametrize("name", CASES)
def test_every_rendered_object_is_valid_for_its_kind(rendered, schemas, name):
    kinds = [d["kind"] for d in rendered[name]]
    assert kinds.count("RayService") == 1
    for doc in rendered[name]:
        validate(doc)


def test_a_misspelt_field_fails_validation(rendered, schemas):
    """The RayService check is strict: KubeRay would drop an unknown field without a word."""
    import jsonschema

    doc = json.loads(json.dumps(one(rendered["defaults"], "RayService")))
    doc["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParam"] = {}
    with pytest.raises(jsonschema.ValidationError, match="rayStartParam"):
        validate(doc)


@pytest.mark.parametrize("name", CASES)
def test_serve_config_is_what_hbmserve_writes_for_the_same_cluster(rendered, name):
    """Each application's `cluster` parses into a valid ClusterSpec, and serve_config() of that spec
    gives the same applications: the chart and `hbmserve serve-config` are one config."""
    rendered_config = rendered_serve_config(rendered[name])
    apps = rendered_config["applications"]
    for app in apps:
        BuilderArgs.model_validate(app["args"])
    specs = [parse_cluster_spec(a["args"]["cluster"], source=f"{name}: {a['name']}") for a in apps]
    assert all(s == specs[0] for s in specs)
    spec = specs[0]
    door = apps[-1]
    expected = serve_config(spec, door["args"]["internal_token_file"], door["args"]["front_door_replicas"])
    for app in (*expected["applications"], *apps):
        app["args"]["cluster"] = parse_cluster_spec(app["args"]["cluster"])
    assert rendered_config == expected
    assert [a["name"] for a in apps] == [m.name for m in spec.models] + [APP_NAME]
    assert {a["import_path"] for a in apps} == {MODEL_APP_IMPORT, FRONT_DOOR_APP_IMPORT}


@pytest.mark.parametrize("name", CASES)
def test_ray_serve_accepts_the_serve_config(rendered, name):
    from ray.serve.schema import ServeDeploySchema

    config = ServeDeploySchema.model_validate(rendered_serve_config(rendered[name]))
    assert config.proxy_location.value == "Disabled"  # the front door carries the bytes
    assert all(a.route_prefix is None for a in config.applications)


@pytest.mark.parametrize("name", CASES)
def test_one_front_door_per_ray_node(rendered, name):
    cluster = ray_cluster(rendered[name])
    nodes = 1 + sum(g["replicas"] for g in cluster["workerGroupSpecs"])
    door = rendered_serve_config(rendered[name])["applications"][-1]
    assert door["args"]["front_door_replicas"] == nodes


@pytest.mark.parametrize("name", CASES)
def test_front_door_port_is_the_serve_port_of_every_pod(rendered, name):
    port = parse_cluster_spec(rendered_serve_config(rendered[name])["applications"][0]["args"]["cluster"]).serve.http.port
    for group, template in pod_templates(rendered[name]):
        (container,) = template["spec"]["containers"]
        assert {"name": "serve", "containerPort": port} in container["ports"], group
    assert one(rendered[name], "Service", "-hbmserve")["spec"]["ports"][0]["targetPort"] == "serve"


def test_values_schema_mirrors_the_config():
    """values.schema.json's `$defs` are ClusterSpec's and ClusterFile's own schemas; after a change
    to either, run `python tests/chart/values_schema.py --write`."""
    assert json.loads(SCHEMA_FILE.read_text())["$defs"] == generated_defs()
