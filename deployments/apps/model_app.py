"""A model's Serve application when the placement planner does not place it: one engine
deployment (deployments/replica/engine_replica.py), its options from options.py; and the check that every
model's engine can be built here before anything deploys.
"""

from __future__ import annotations

import hashlib

from hbmserve.deployments.apps.options import model_options
from hbmserve.core.config import ClusterSpec, ModelSpec
from hbmserve.core.disagg_spec import Role
from hbmserve.core.engine_settings import EngineKind
from hbmserve.deployments.replica.engine_replica import ENGINE_SERVERS, EngineReplica


def unsupported_engines(spec: ClusterSpec) -> list[str]:
    problems = [f"models.{i}.engine: '{m.engine.value}' is not available in this build (have: "
                f"{', '.join(k.value for k in ENGINE_SERVERS)})"
                for i, m in enumerate(spec.models) if m.engine not in ENGINE_SERVERS]
    return problems + _sim_scenario_problems(spec)


def _sim_scenario_problems(spec: ClusterSpec) -> list[str]:
    """A simulated model that cannot be simulated (unknown GPU or shape, does not fit) fails here,
    before deploying, rather than as a replica constructor crash-looping in Serve."""
    sims = [m for m in spec.models if m.engine is EngineKind.SIM]
    if not sims:
        return []
    from hbmserve.capacity.perf.hardware import CatalogError, load_catalog
    from hbmserve.capacity.perf.model_shape import ModelConfigError
    from hbmserve.capacity.perf.scenario import ScenarioError, scenario_for

    catalog, problems = load_catalog(), []
    # A disaggregated model's replicas run its pools, each with its own parallelism and settings.
    views = [v for m in sims for v in ([m] if m.disaggregation is None else [m.pool(r) for r in Role])]
    for m in views:
        try:
            scenario_for(m, catalog)
        except (ScenarioError, ModelConfigError, CatalogError) as err:
            msg = str(err)
            problems.append(msg if msg.startswith("models.") else f"models.{m.name}.sim: {msg}")
    return problems


def build_model_app(spec: ClusterSpec, model: ModelSpec, internal_token: str, replicas: int | None = None):
    """The model's Serve application: its engine deployment, or a disaggregated model's two, one
    per pool (the decode pool's binds the prefill pool's, so that Serve deploys both). A model
    that may scale to zero needs nothing more: the front door holds its requests while no
    replica is active. `replicas` overrides a fixed model's count alone (a rollout's step), so
    that Serve sees a lightweight change and restarts no replica."""
    if model.disaggregation is not None:
        prefill = _engine_deployment(spec, model, internal_token, None, Role.PREFILL)
        return _engine_deployment(spec, model, internal_token, None, Role.DECODE, prefill)
    return _engine_deployment(spec, model, internal_token, replicas)


def _engine_deployment(spec: ClusterSpec, model: ModelSpec, internal_token: str, replicas: int | None,
                       role: Role | None = None, *peers):
    """`role`: the deployment of that pool of the disaggregated `model`; its replicas run the
    pool as a model (`ModelSpec.pool`)."""
    from ray import serve

    kwargs = model_options(model, role.value if role else None).serve_kwargs()
    deployment = serve.deployment(EngineReplica, **kwargs | ({} if replicas is None else {"num_replicas": replicas}))
    pool = model if role is None else model.pool(role)
    args = (pool.model_dump_json(), spec.serve.http.host, internal_token, spec.cache.model_dump_json())
    if role is not None:
        args += (role.value,)
    # A version named by what the replicas are built from: without one, `serve.run` gives each
    # call a random version and restarts every replica even when only the count changed.
    # (`version` is an internal option of Serve's since the public argument was removed.)
    version = hashlib.sha256("\0".join(args).encode()).hexdigest()[:16]
    return deployment.options(version=version, _internal=True).bind(*args, *peers)
