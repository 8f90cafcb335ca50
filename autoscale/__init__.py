"""Scaling: pure policies over snapshots (policy, baselines, registry) and the thin Ray Serve
adapter (serve_adapter, which imports nothing from Ray itself)."""

from hbmserve.autoscale.policy import AutoscaleConfig, PolicyState, decide

__all__ = ["AutoscaleConfig", "PolicyState", "decide"]
