"""Ray Serve application builders, so that a declarative Serve config (KubeRay's `serveConfigV2`,
or `serve deploy config.yaml`) deploys what `hbmserve deploy` deploys.

`hbmserve deploy` builds its applications in its own process and makes the internal token there.
A declarative config can only name an import path and plain `args`, so the same applications are
built here from args: the cluster config as data, the model's name, and the path of a file that
holds the internal token (a mounted Kubernetes Secret: a token inlined in the config would be
readable by anyone who can read the RayService or `serve config`). `serve_config` writes the whole
config for a ClusterSpec; the Helm chart renders the same structure from its values, and
tests/chart check one against the other.

Each builder fails closed: bad args, a missing or short token file, unreadable key files or an
infeasible placement raise `ServeConfigError` naming the arg at fault, and the application fails
to deploy with that message (shown by `serve status` and the RayService's status).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hbmserve.core.config import ClusterSpec, ConfigError, ModelSpec, parse_cluster_spec
from hbmserve.deployments.wire.names import FRONT_DOOR_APP

MODEL_APP_IMPORT = "hbmserve.deployments.apps.declarative:model_app"
FRONT_DOOR_APP_IMPORT = "hbmserve.deployments.apps.declarative:front_door_app"
# Where the chart mounts the internal token Secret; the default of `hbmserve serve-config`.
DEFAULT_INTERNAL_TOKEN_FILE = "/etc/hbmserve/internal/token"
# `hbmserve deploy` makes 32 random bytes (43 characters); a shorter token is a mistake, not a choice.
MIN_TOKEN_CHARS = 32


class ServeConfigError(ValueError):
    """Builder args that cannot be deployed; the message names the arg and never a secret."""


class BuilderArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # The cluster config (ClusterSpec) as data: what `hbmserve deploy` reads from its YAML file.
    cluster: dict[str, Any]
    # A file holding the token the front door proves itself to the replicas with.
    internal_token_file: Annotated[str, Field(min_length=1)]
    model: Annotated[str, Field(min_length=1)] | None = None  # model_app: which model of `cluster`
    # front_door_app: how many front doors, one per Ray node (Serve's max_replicas_per_node=1).
    front_door_replicas: Annotated[int, Field(ge=1)] = 1


def _parse(args: dict[str, Any], builder: str) -> tuple[BuilderArgs, ClusterSpec]:
    try:
        parsed = BuilderArgs.model_validate(args)
    except ValidationError as err:
        lines = [f"args.{'.'.join(str(p) for p in e['loc'])}: "
                 f"{'unknown field' if e['type'] == 'extra_forbidden' else e['msg']}" for e in err.errors()]
        raise ServeConfigError(f"{builder}: bad args:\n  " + "\n  ".join(lines)) from None
    try:
        spec = parse_cluster_spec(parsed.cluster, source="args.cluster")
    except ConfigError as err:
        raise ServeConfigError(f"{builder}: {err}") from None
    return parsed, spec


def read_internal_token(path: str) -> str:
    """The internal token from its file (trailing whitespace dropped); fails closed."""
    try:
        token = Path(path).read_text().strip()
    except OSError as err:
        raise ServeConfigError(f"args.internal_token_file: cannot read {path} ({err.strerror or err}); the "
                               "internal token comes from a mounted Secret and nothing deploys without it") from None
    if len(token) < MIN_TOKEN_CHARS:
        raise ServeConfigError(f"args.internal_token_file: {path} holds {len(token)} characters; the internal "
                               f"token needs at least {MIN_TOKEN_CHARS} (e.g. `openssl rand -base64 33`)")
    return token


def _check_deployable(spec: ClusterSpec, builder: str) -> None:
    from hbmserve.deployments.ingress.front_door_access import AccessConfigError, load_key_ring
    from hbmserve.deployments.apps.model_app import unsupported_engines

    problems = unsupported_engines(spec)
    if problems:
        raise ServeConfigError(f"{builder}: cannot deploy:\n  " + "\n  ".join(problems))
    try:
        load_key_ring(spec.serve.auth)  # the front door checks again where it runs; fail early and clearly
    except AccessConfigError as err:
        raise ServeConfigError(f"{builder}: {err}") from None


def model_app(args: dict[str, Any]):
    """Serve application builder: the engine application of `args.model` (as `hbmserve deploy`
    builds it, placed by the planner when the cluster has a `topology` and the model needs GPUs)."""
    parsed, spec = _parse(args, "model_app")
    if "front_door_replicas" in parsed.model_fields_set:
        raise ServeConfigError("model_app: args.front_door_replicas: only the front door application takes it; "
                               "remove it")
    model = spec.model(parsed.model or "")
    if model is None:
        raise ServeConfigError(f"model_app: args.model: {parsed.model!r} is not a model of args.cluster "
                               f"(models: {', '.join(m.name for m in spec.models)})")
    _check_deployable(spec, "model_app")
    token = read_internal_token(parsed.internal_token_file)
    if spec.plans_placement(model) and model.replica_ceiling > 0:
        return _placed_app(spec, model, token)
    from hbmserve.deployments.apps.model_app import build_model_app

    return build_model_app(spec, model, token)


def _placed_app(spec: ClusterSpec, model: ModelSpec, token: str):
    from hbmserve.deployments.apps.placed_app import build_placed_app, infeasible_message, plan_models
    from hbmserve.placement.cluster_file import TopologyFileError, load_cluster_file

    try:
        topology = load_cluster_file(spec.topology)
    except TopologyFileError as err:
        raise ServeConfigError(f"model_app: args.cluster.topology: {err}") from None
    result = plan_models(spec, topology)[model.name]
    if not result.feasible:
        raise ServeConfigError(f"model_app: {infeasible_message(model, result)}")
    return build_placed_app(spec.serve.http.host, token, model, result, topology, spec.cache)


def front_door_app(args: dict[str, Any]):
    """Serve application builder: the front door, `args.front_door_replicas` of them."""
    parsed, spec = _parse(args, "front_door_app")
    if parsed.model is not None:
        raise ServeConfigError("front_door_app: args.model: the front door serves every model of args.cluster; "
                               "remove it")
    _check_deployable(spec, "front_door_app")
    from hbmserve.deployments.apps.service_apps import build_front_door_app

    return build_front_door_app(spec, read_internal_token(parsed.internal_token_file), parsed.front_door_replicas)


def serve_config(spec: ClusterSpec, internal_token_file: str = DEFAULT_INTERNAL_TOKEN_FILE,
                 front_door_replicas: int = 1) -> dict[str, Any]:
    """The Serve config (Serve's ServeDeploySchema, as plain data) that deploys `spec` through the
    builders above: one application per model plus the front door, none behind Serve's proxy
    (the front door carries the bytes; deployments/ingress/front_door.py says why)."""

    def args(**own: Any) -> dict[str, Any]:
        # A fresh copy per application: one shared dict would print as YAML anchors and aliases.
        return {"cluster": spec.model_dump(mode="json", exclude_defaults=True),
                "internal_token_file": internal_token_file, **own}

    apps = [{"name": m.name, "import_path": MODEL_APP_IMPORT, "route_prefix": None, "args": args(model=m.name)}
            for m in spec.models]
    apps.append({"name": FRONT_DOOR_APP, "import_path": FRONT_DOOR_APP_IMPORT, "route_prefix": None,
                 "args": args(front_door_replicas=front_door_replicas)})
    return {"proxy_location": "Disabled", "http_options": {"host": spec.serve.http.host}, "applications": apps}
