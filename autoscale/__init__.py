"""Scaling brains: hbmserve's policy (`decide`), the baselines it is measured against, and the
registry that names them. Pure; imports only hbmserve.core. The Ray Serve adapter that calls
`decide` live is hbmserve.deployments.control.autoscaling."""

from hbmserve.autoscale.policy_config import AutoscaleConfig
from hbmserve.autoscale.policy import PolicyState, decide

__all__ = ["AutoscaleConfig", "PolicyState", "decide"]
