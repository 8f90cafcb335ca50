"""The cluster's two service applications: the front door (one per node) and the warm-tier
aggregator (one for the cluster). Their options come from options.py like every deployment's."""

from __future__ import annotations

from hbmserve.deployments.apps.options import front_door_options, warm_tier_options
from hbmserve.deployments.control.warm_tier import WarmTier
from hbmserve.core.config import ClusterSpec
from hbmserve.deployments.ingress.front_door import FrontDoor


def build_front_door_app(spec: ClusterSpec, internal_token: str, nodes: int):
    from ray import serve

    return serve.deployment(FrontDoor, **front_door_options(nodes).serve_kwargs()).bind(spec.model_dump_json(),
                                                                                        internal_token)


def build_warm_tier_app(spec: ClusterSpec):
    from ray import serve

    return serve.deployment(WarmTier, **warm_tier_options().serve_kwargs()).bind(spec.model_dump_json())
