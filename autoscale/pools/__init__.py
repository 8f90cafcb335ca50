"""Scaling a disaggregated model's two pools from one policy (issue 23): `decide_pools`."""
