"""Per-request decisions, pure: `replica_cap.py` (a replica's cap: accept now, or refuse with a
reason and Retry-After), `queue.admit` (a model's ingress: admit, queue or refuse, with priorities
and an SLO), `choose` (rank replicas for one request), the routers it is measured against
(routers.py), the prompt block hashes its prefix affinity keys on (prefix.py) and the KV index
kept from the engines' KV events (kv_index.py). A brain: imports only hbmserve.core."""
