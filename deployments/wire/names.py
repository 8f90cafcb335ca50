"""The names every room looks each other up by: Serve applications and deployments.

The front door reads a model's decision record and its replicas' endpoints under the engine
deployment's name, the control plane publishes under it, the replica announces under it, and the
app builder creates it: so the name is made here, once.
"""

from __future__ import annotations

from hbmserve.core.config import ModelSpec
from hbmserve.core.disagg_spec import Role

FRONT_DOOR_APP = "hbmserve-frontdoor"
FRONT_DOOR_DEPLOYMENT = "frontdoor"
WARM_TIER_APP = "hbmserve-warm-tier"
WARM_TIER_DEPLOYMENT = "warmtier"


def serve_name(name: str) -> str:
    """A model name made safe for a Serve deployment name (no '/' or ':', which Hub ids hold)."""
    return name.replace("/", "-").replace(":", "-")


def engine_deployment_name(model: ModelSpec | str, role: str | None = None) -> str:
    """The model's engine deployment (of the model, or of its name); a disaggregated model has
    one per pool (`role`: prefill or decode). A planned model's decisions are published under it
    too, though its deployments are one per slot (`slot_deployment_name`)."""
    name = model if isinstance(model, str) else model.name
    return serve_name(f"engine-{name}" + (f"-{role}" if role else ""))


def pool_key(model: str, role: str | None) -> str:
    """How the front door keys a model's replicas that scale together: the model, or one pool of
    a disaggregated model ('#' is never in a model's name)."""
    return model if role is None else f"{model}#{role}"


def slot_deployment_name(model: ModelSpec, slot: int) -> str:
    """The deployment of a planned model's replica `slot` (deployments/apps/placed_app.py)."""
    return serve_name(f"engine-{model.name}-r{slot}")


def engine_pools(model: ModelSpec) -> dict[str, tuple[str, ModelSpec]]:
    """pool_key -> (engine deployment name, the pool as a model) of each group of the model's
    replicas that scales on its own: the model, or a disaggregated model's two pools."""
    if model.disaggregation is None:
        return {model.name: (engine_deployment_name(model), model)}
    return {pool_key(model.name, role.value): (engine_deployment_name(model, role.value), model.pool(role))
            for role in Role}


def pool_prices(models, price_of) -> dict[str, float | None]:
    """pool_key -> one replica's hourly price (`price_of(the pool as a model)`), for every model."""
    return {key: price_of(pool) for m in models for key, (_, pool) in engine_pools(m).items()}
