"""Per-request decisions, pure: `admission.admit` (a replica's cap: accept now, or refuse with a
reason and Retry-After), `queue.admit` (a model's ingress: admit, queue or refuse, with priorities
and an SLO), `choose` (rank replicas for one request), the routers it is measured against
(baselines.py) and the prompt block hashes its prefix affinity keys on (prefix.py). A brain:
imports only hbmserve.core."""
