"""A disaggregated model's two pools in the simulator (issue 23): the pools' event loop, fixed or
scaled over time (disagg_sim.py), and the evaluation of scaling policies on it (pools_eval.py)."""
