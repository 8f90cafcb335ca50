"""The capacity planner's parts: the performance model and hardware catalog (perf/), the
simulator (sim/), the planner (planning/) and arrival traces (traces/)."""
