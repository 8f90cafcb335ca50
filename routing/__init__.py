"""Per-request decisions, pure: `admit` (accept now, or refuse with a reason and Retry-After),
`choose` (rank replicas for one request), the routers it is measured against (baselines.py) and
the prompt block hashes its prefix affinity keys on (prefix.py). A brain: imports only hbmserve.core."""
