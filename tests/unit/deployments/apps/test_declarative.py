"""The Serve application builders behind a declarative Serve config (KubeRay's serveConfigV2,
`serve deploy`): args in, the same applications `hbmserve deploy` builds out, failing closed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import hbmserve.placement as placement_pkg
from hbmserve.core.config import parse_cluster_spec
from hbmserve.deployments.apps import model_app as serve_app, placed_app
from hbmserve.deployments.apps import service_apps as front_door
from hbmserve.deployments.apps.placed_app import plan_models
from hbmserve.deployments.apps.declarative import (FRONT_DOOR_APP_IMPORT, MIN_TOKEN_CHARS, MODEL_APP_IMPORT, ServeConfigError,
                                               front_door_app, model_app, read_internal_token, serve_config)
from hbmserve.placement.cluster_file import load_cluster_file
from hbmserve.deployments.wire.names import FRONT_DOOR_APP as FRONT_DOOR_APP_NAME

PAIRS = Path(placement_pkg.__file__).parent / "data" / "cluster_nvlink_pairs_x2.yaml"
TOKEN = "t" * MIN_TOKEN_CHARS + "-internal"
CLUSTER = {"name": "c", "serve": {"http": {"host": "0.0.0.0", "port": 8000}},
           "models": [{"name": "a", "source": "/m/a", "engine": "sim"},
                      {"name": "b", "source": "/m/b", "engine": "sim", "replicas": 2}]}


@pytest.fixture
def token_file(tmp_path) -> str:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")  # as a Secret made with a trailing newline mounts it
    return str(path)


@pytest.fixture
def built(monkeypatch):
    """What each builder was asked to build, instead of a Serve application."""
    calls = []
    monkeypatch.setattr(serve_app, "build_model_app", lambda *a: calls.append(("model", *a)) or "app")
    monkeypatch.setattr(placed_app, "build_placed_app", lambda *a: calls.append(("placed", *a)) or "app")
    monkeypatch.setattr(front_door, "build_front_door_app", lambda *a: calls.append(("door", *a)) or "app")
    return calls


def test_model_app_builds_what_deploy_builds_with_the_token_from_the_file(built, token_file):
    assert model_app({"cluster": CLUSTER, "internal_token_file": token_file, "model": "b"}) == "app"
    ((kind, spec, model, token),) = built
    assert kind == "model" and spec == parse_cluster_spec(CLUSTER) and model is spec.models[1] and token == TOKEN


def test_front_door_app_builds_the_front_doors(built, token_file):
    front_door_app({"cluster": CLUSTER, "internal_token_file": token_file, "front_door_replicas": 3})
    assert built == [("door", parse_cluster_spec(CLUSTER), TOKEN, 3)]


def test_a_planned_model_is_placed_as_deploy_places_it(built, token_file, tmp_path):
    cluster = {"topology": str(PAIRS), "models": [
        {"name": "first", "source": "/m", "engine": "sim", "sim": {"reserve_gpus": True},
         "parallelism": {"tp": 2}, "replicas": 2},
        {"name": "second", "source": "/m", "engine": "sim", "sim": {"reserve_gpus": True},
         "parallelism": {"tp": 2}, "replicas": 2}]}
    model_app({"cluster": cluster, "internal_token_file": token_file, "model": "second"})
    ((kind, host, token, model, result, topology, cache),) = built
    spec = parse_cluster_spec(cluster)
    assert (kind, host, token, model, cache) == ("placed", "127.0.0.1", TOKEN, spec.models[1], spec.cache)
    assert result == plan_models(spec, load_cluster_file(PAIRS))["second"]


def test_plan_models_gives_each_model_gpus_no_earlier_model_holds():
    spec = parse_cluster_spec({"topology": str(PAIRS), "models": [
        {"name": n, "source": "/m", "engine": "vllm-gpu", "parallelism": {"tp": 2}, "replicas": 2}
        for n in ("x", "y")] + [{"name": "cpu", "source": "/m", "engine": "vllm-cpu"}]})
    plans = plan_models(spec, load_cluster_file(PAIRS))
    assert set(plans) == {"x", "y"}  # the CPU model is not placed
    held = [{g for r in plans[n].replicas for g in r.members} for n in ("x", "y")]
    assert len(held[0]) == len(held[1]) == 4 and not held[0] & held[1]  # 8 GPUs, two TP=2 x 2 models


def test_an_infeasible_plan_fails_the_application_with_the_planners_reason(built, token_file):
    cluster = {"topology": str(PAIRS), "models": [{"name": "big", "source": "/m", "engine": "vllm-gpu",
                                                   "parallelism": {"tp": 4}}]}
    with pytest.raises(ServeConfigError, match="model big: no placement for replicas=1: .*largest here is 2"):
        model_app({"cluster": cluster, "internal_token_file": token_file, "model": "big"})
    assert built == []


@pytest.mark.parametrize(("contents", "says"), [
    (None, "cannot read"),
    ("", "holds 0 characters; the internal token needs at least 32"),
    ("short-token\n", "holds 11 characters"),
])
def test_the_internal_token_fails_closed(tmp_path, contents, says):
    path = tmp_path / "token"
    if contents is not None:
        path.write_text(contents)
    with pytest.raises(ServeConfigError, match=says) as err:
        read_internal_token(str(path))
    assert str(err.value).startswith("args.internal_token_file: ")
    assert "short-token" not in str(err.value)  # never quotes the token


def test_read_internal_token_drops_the_trailing_newline(token_file):
    assert read_internal_token(token_file) == TOKEN


@pytest.mark.parametrize(("builder", "args", "says"), [
    (model_app, {"model": "nope"}, "model_app: args.model: 'nope' is not a model of args.cluster (models: a, b)"),
    (model_app, {"model": "a", "front_door_replicas": 2}, "args.front_door_replicas: only the front door"),
    (front_door_app, {"model": "a"}, "front_door_app: args.model: the front door serves every model"),
    (front_door_app, {"front_door_replicas": 0}, "args.front_door_replicas: Input should be greater than or equal to 1"),
    (model_app, {"model": "a", "internal_token": "inline"}, "args.internal_token: unknown field"),
    (model_app, {"model": "a", "cluster": {**CLUSTER, "models": [{"name": "a", "source": "/m", "replicas": -1}]}},
     "invalid config args.cluster:\n  models.0.replicas: Input should be greater than or equal to 0"),
    (model_app, {"model": "a", "cluster": {**CLUSTER, "serve": {"auth": {"keys_file": "/no/keys.yaml"}}}},
     "serve.auth.keys_file: cannot read /no/keys.yaml"),
])
def test_bad_args_fail_naming_the_arg(built, token_file, builder, args, says):
    with pytest.raises(ServeConfigError, match=None) as err:
        builder({"cluster": CLUSTER, "internal_token_file": token_file, **args})
    assert says in str(err.value)
    assert built == []


def test_a_missing_token_deploys_nothing(built, tmp_path):
    with pytest.raises(ServeConfigError, match="args.internal_token_file"):
        front_door_app({"cluster": CLUSTER, "internal_token_file": str(tmp_path / "absent")})
    assert built == []


def test_serve_config_names_every_model_and_the_front_door_behind_no_proxy():
    spec = parse_cluster_spec(CLUSTER)
    config = serve_config(spec, "/run/token", front_door_replicas=4)
    assert config["proxy_location"] == "Disabled" and config["http_options"] == {"host": "0.0.0.0"}
    assert [(a["name"], a["import_path"]) for a in config["applications"]] == [
        ("a", MODEL_APP_IMPORT), ("b", MODEL_APP_IMPORT), (FRONT_DOOR_APP_NAME, FRONT_DOOR_APP_IMPORT)]
    for app in config["applications"]:
        assert app["route_prefix"] is None and app["args"]["internal_token_file"] == "/run/token"
        assert parse_cluster_spec(app["args"]["cluster"]) == spec
    assert config["applications"][-1]["args"]["front_door_replicas"] == 4
    assert "&id" not in yaml.safe_dump(config)  # one copy per application, no YAML aliases


def test_serve_accepts_the_config_and_the_builders_make_applications(token_file):
    from ray.serve import Application
    from ray.serve.schema import ServeDeploySchema

    config = serve_config(parse_cluster_spec(CLUSTER), token_file, 2)
    ServeDeploySchema.model_validate(config)
    apps = {a["name"]: a for a in config["applications"]}
    assert isinstance(model_app(apps["a"]["args"]), Application)
    assert isinstance(front_door_app(apps[FRONT_DOOR_APP_NAME]["args"]), Application)
