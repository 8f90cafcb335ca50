"""Per-request decisions, pure: `admission.admit` (a replica's cap: accept now, or refuse with a
reason and Retry-After), `queue.admit` (a model's ingress: admit, queue or refuse, with priorities
and an SLO) and `choose` (rank replicas for one request). A brain: imports only hbmserve.core."""
