"""The names every room looks each other up by: Serve applications and deployments.

The front door reads a model's decision record and its replicas' endpoints under the engine
deployment's name, the control plane publishes under it, the replica announces under it, and the
app builder creates it: so the name is made here, once.
"""

from __future__ import annotations

from hbmserve.core.config import ModelSpec

FRONT_DOOR_APP = "hbmserve-frontdoor"
FRONT_DOOR_DEPLOYMENT = "frontdoor"
WARM_TIER_APP = "hbmserve-warm-tier"
WARM_TIER_DEPLOYMENT = "warmtier"


def serve_name(name: str) -> str:
    """A model name made safe for a Serve deployment name (no '/' or ':', which Hub ids hold)."""
    return name.replace("/", "-").replace(":", "-")


def engine_deployment_name(model: ModelSpec | str) -> str:
    """The model's engine deployment (of the model, or of its name). A planned model's decisions
    are published under it too, though its deployments are one per slot (`slot_deployment_name`)."""
    return serve_name(f"engine-{model if isinstance(model, str) else model.name}")


def slot_deployment_name(model: ModelSpec, slot: int) -> str:
    """The deployment of a planned model's replica `slot` (deployments/apps/placed_app.py)."""
    return serve_name(f"engine-{model.name}-r{slot}")
