"""The performance model: hardware catalog, model shapes, step costs, the simulated engine core and
its KV blocks, a replica's capacity and price. A brain: imports only hbmserve.core."""
